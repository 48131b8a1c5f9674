//! The calibration functions: one per prologue class, in the agent's own binary, each starting
//! with an instruction of its class and going on into a common body (what a hit costs depends on
//! the probed function's first instruction, and on the code after it: see the parent module).

use std::hint::black_box;

use super::Prologue;

pub(super) type CalibrationFn = unsafe extern "C" fn(*mut i32) -> i32;

// One function per prologue class, each starting with an instruction of its class and going on
// into the common body (`vgpu_calibrate_body`), which returns 0. `vgpu_calibrate_endbr64` starts as
// CET builds do, an `endbr64` and a push (probed on the push, as a library's functions are: see
// `Prologue::classify`). `vgpu_calibrate_branch` starts like every entry point of NVIDIA's 5xx
// libcuda in Debian, a compare of a RIP-relative word with an immediate and a conditional jump
// (probed on the jump). `vgpu_calibrate_other` starts with a load of a RIP-relative word into an
// argument register, which no probe can be moved past: single-stepped out of line.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.vgpu_calibrate,\"ax\",@progbits",
    ".globl vgpu_calibrate_push",
    ".type vgpu_calibrate_push,@function",
    ".p2align 4",
    "vgpu_calibrate_push:",
    "push rbp",
    "mov rbp, rsp",
    "pop rbp",
    "jmp {body}",
    ".size vgpu_calibrate_push, .-vgpu_calibrate_push",
    ".globl vgpu_calibrate_nop5",
    ".type vgpu_calibrate_nop5,@function",
    ".p2align 4",
    "vgpu_calibrate_nop5:",
    ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00",
    "jmp {body}",
    ".size vgpu_calibrate_nop5, .-vgpu_calibrate_nop5",
    ".globl vgpu_calibrate_endbr64",
    ".type vgpu_calibrate_endbr64,@function",
    ".p2align 4",
    "vgpu_calibrate_endbr64:",
    ".byte 0xf3, 0x0f, 0x1e, 0xfa",
    "push rbp",
    "mov rbp, rsp",
    "pop rbp",
    "jmp {body}",
    ".size vgpu_calibrate_endbr64, .-vgpu_calibrate_endbr64",
    ".globl vgpu_calibrate_branch",
    ".type vgpu_calibrate_branch,@function",
    ".p2align 4",
    "vgpu_calibrate_branch:",
    "cmp dword ptr [rip + vgpu_calibrate_word], 0x321cba00",
    "je 2f",
    "jmp {body}",
    "2:",
    "jmp {body}",
    ".size vgpu_calibrate_branch, .-vgpu_calibrate_branch",
    ".globl vgpu_calibrate_other",
    ".type vgpu_calibrate_other,@function",
    ".p2align 4",
    "vgpu_calibrate_other:",
    "mov esi, dword ptr [rip + vgpu_calibrate_word]",
    "jmp {body}",
    ".size vgpu_calibrate_other, .-vgpu_calibrate_other",
    ".popsection",
    ".pushsection .data.vgpu_calibrate,\"aw\",@progbits",
    ".p2align 2",
    "vgpu_calibrate_word:",
    ".long 0",
    ".popsection",
    body = sym vgpu_calibrate_body,
);

/// The common body of the calibration functions: a few hundred nanoseconds of loads and
/// branches over a 2 KiB table, about what a driver entry point does before its real work. A hit
/// costs more than its trap: the code that runs after it finds its predictors and cache lines
/// disturbed, and a function that returned at once would not show that (on the development VM a
/// bare `ret` put the cost about 10% under the slowdown of a probed simulated-driver call).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn vgpu_calibrate_body(_v: *mut i32) -> i32 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static TABLE: [AtomicU64; 256] = [const { AtomicU64::new(0) }; 256];
    let mut acc = 0u64;
    for i in 0..64usize {
        // Relaxed: nothing else reads or writes the table; the loads only stand for work.
        let v = TABLE[(i * 37) % 256].load(Ordering::Relaxed);
        if (v ^ i as u64) & 1 == 0 {
            acc = acc.wrapping_add(v);
        } else {
            acc ^= v.rotate_left(7);
        }
    }
    black_box(acc);
    0
}

#[cfg(target_arch = "x86_64")]
unsafe extern "C" {
    fn vgpu_calibrate_push(v: *mut i32) -> i32;
    fn vgpu_calibrate_nop5(v: *mut i32) -> i32;
    fn vgpu_calibrate_endbr64(v: *mut i32) -> i32;
    fn vgpu_calibrate_branch(v: *mut i32) -> i32;
    fn vgpu_calibrate_other(v: *mut i32) -> i32;
}

/// The calibration function of each class: its symbol and a pointer to call it.
#[cfg(target_arch = "x86_64")]
pub(super) const STUBS: [(Prologue, &str, CalibrationFn); 5] = [
    (Prologue::Push, "vgpu_calibrate_push", vgpu_calibrate_push),
    (Prologue::Nop5, "vgpu_calibrate_nop5", vgpu_calibrate_nop5),
    (
        Prologue::Endbr64,
        "vgpu_calibrate_endbr64",
        vgpu_calibrate_endbr64,
    ),
    (
        Prologue::Branch,
        "vgpu_calibrate_branch",
        vgpu_calibrate_branch,
    ),
    (
        Prologue::Other,
        "vgpu_calibrate_other",
        vgpu_calibrate_other,
    ),
];

/// The calibration functions' common body, called directly: never probed, it gives the
/// unprobed time of a calibration call at each re-measurement.
#[cfg(target_arch = "x86_64")]
pub(super) const UNPROBED_BODY: CalibrationFn = body_call;

#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn body_call(v: *mut i32) -> i32 {
    vgpu_calibrate_body(v)
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) const UNPROBED_BODY: CalibrationFn = unprobed_self_call;

/// Elsewhere, one plain Rust function stands for every class.
#[cfg(not(target_arch = "x86_64"))]
pub(super) const STUBS: [(Prologue, &str, CalibrationFn); 1] =
    [(Prologue::Other, "vgpu_agent_calibration_target", self_call)];

/// A plain Rust function of the agent's own binary (the calibration target where there are no
/// class stubs).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn vgpu_agent_calibration_target(v: *mut i32) -> i32 {
    black_box(v);
    0
}

#[cfg(not(target_arch = "x86_64"))]
unsafe extern "C" fn self_call(v: *mut i32) -> i32 {
    vgpu_agent_calibration_target(v)
}

/// The same work as [`vgpu_agent_calibration_target`], in a function that is never probed.
#[cfg(not(target_arch = "x86_64"))]
unsafe extern "C" fn unprobed_self_call(v: *mut i32) -> i32 {
    black_box(v);
    0
}
