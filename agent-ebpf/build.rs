// Rebuild when the linker changes (a new bpf-linker can change the emitted object).
fn main() {
    if let Ok(path) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
