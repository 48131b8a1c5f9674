//! A simulated CUDA driver.
