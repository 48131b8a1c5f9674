//! Link options of `libvgpu_limiter.so`.

use std::{env, fs, path::PathBuf};

fn main() {
    // The allocation and free hooks and everything they call on their common path are marked
    // `link_section = ".text.hot.vgpu"`, and the statics they read `".data.hot.vgpu"`. This
    // script gathers each kind into one page-aligned output section (the rest of the default
    // layout is unchanged: `INSERT`), so that a pair of calls finding their caches cold fetch
    // two or three pages of code instead of seven to nine scattered over the library, and one
    // page of statics instead of two (docs/benchmarks.md, "The limiter with cold caches").
    let script = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("hot.ld");
    fs::write(
        &script,
        concat!(
            "SECTIONS {\n  .text.hot : ALIGN(4096) { *(.text.hot .text.hot.*) }\n} INSERT BEFORE .text;\n",
            "SECTIONS {\n  .data.hot : ALIGN(4096) { *(.data.hot .data.hot.*) }\n} INSERT BEFORE .data;\n",
        ),
    )
    .expect("write the linker script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-T,{}", script.display());
    println!("cargo:rerun-if-changed=build.rs");
}
