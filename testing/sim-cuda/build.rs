//! Gives the library the soname of the real driver, so that it can be installed or copied as
//! `libcuda.so.1` and programs linked against libcuda load it.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
