//! Declares the `loom` cfg so `RUSTFLAGS="--cfg loom"` builds without `unexpected_cfgs` warnings.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
