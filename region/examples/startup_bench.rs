//! Start-up benchmark: N processes (default 64) start at once on a fresh region file and each
//! measures the time from the start signal to a usable region (`open_or_create` + `claim_slot`).
//! Prints one JSON object with p50/p99/max in microseconds.
//!
//! `cargo run -p region --release --example startup_bench [-- --processes N --rounds R --dir D]`
//! (default directory `/dev/shm`).
//!
//! The start signal is one pipe shared by all children: each blocks in `read` of one byte, and
//! the parent writes N bytes in one call.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use region::{Region, RegionConfig};

fn child(path: &str) {
    // One unbuffered byte: `std::io::stdin()` is buffered and would take other children's bytes.
    let mut byte = 0u8;
    // SAFETY: reads at most one byte into a valid, writable local.
    let n = unsafe { libc::read(0, (&mut byte as *mut u8).cast(), 1) };
    assert_eq!(n, 1, "start signal");
    let start = Instant::now();
    let (region, _) =
        Region::open_or_create(path.as_ref(), &RegionConfig::unlimited(8)).expect("open_or_create");
    let _slot = region.claim_slot().expect("claim_slot");
    let elapsed = start.elapsed();
    println!("{}", elapsed.as_nanos());
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 3 && args[1] == "--child" {
        return child(&args[2]);
    }
    let arg = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(default, |v| v.parse().expect("a number"))
    };
    let processes = arg("--processes", 64);
    let rounds = arg("--rounds", 5);
    // The region directory: tmpfs by default (where regions should live: first writes to a
    // disk-backed shared mapping page-fault into the filesystem's block allocation and journal,
    // milliseconds each on ext4). `--dir PATH` measures another filesystem.
    let base = args
        .iter()
        .position(|a| a == "--dir")
        .and_then(|i| args.get(i + 1))
        .map_or_else(
            || std::path::PathBuf::from("/dev/shm"),
            std::path::PathBuf::from,
        );
    let mut all_us: Vec<f64> = Vec::new();
    for _ in 0..rounds {
        let dir = tempfile::Builder::new()
            .tempdir_in(&base)
            .expect("temp dir");
        let path = dir.path().join("region");
        let (read_end, mut write_end) = pipe();
        let children: Vec<_> = (0..processes)
            .map(|_| {
                Command::new(std::env::current_exe().unwrap())
                    .args(["--child", path.to_str().unwrap()])
                    .stdin(read_end.try_clone().unwrap())
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("spawn")
            })
            .collect();
        drop(read_end);
        // Let every child reach its read before the signal.
        std::thread::sleep(std::time::Duration::from_millis(300));
        write_end.write_all(&vec![b'g'; processes]).unwrap();
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "child failed");
            let ns: u64 = String::from_utf8(out.stdout)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            all_us.push(ns as f64 / 1000.0);
        }
    }
    all_us.sort_by(f64::total_cmp);
    let q = |p: f64| all_us[((p * all_us.len() as f64).ceil() as usize).clamp(1, all_us.len()) - 1];
    println!(
        "{{\"bench\":\"region_startup\",\"dir\":{:?},\"processes\":{processes},\"rounds\":{rounds},\
         \"samples\":{},\"p50_us\":{:.1},\"p99_us\":{:.1},\"max_us\":{:.1}}}",
        base.display().to_string(),
        all_us.len(),
        q(0.50),
        q(0.99),
        all_us[all_us.len() - 1]
    );
}

fn pipe() -> (std::fs::File, std::fs::File) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2");
    use std::os::fd::FromRawFd;
    // SAFETY: both fds were just created by pipe2 and are owned by nothing else.
    unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    }
}
