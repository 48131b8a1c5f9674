//! `vgpu-agent run` under test: no calibration, no NVML, the model on a Unix socket in the test's
//! directory and `/metrics` on a free port.

use std::{
    io::{Read, Write},
    net::TcpStream,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{agent_bin, prometheus::free_port, wait_until};

pub struct Daemon {
    child: Child,
    pub socket: PathBuf,
    pub port: u16,
}

impl Daemon {
    /// Starts the daemon with `--interval interval` and `args`, its socket `dir/agent.sock`;
    /// returns once both the socket and `/metrics` accept connections.
    pub fn start(dir: &Path, interval: &str, args: &[&str]) -> Daemon {
        Daemon::start_with_log(dir, interval, args, Stdio::inherit())
    }

    /// As [`Daemon::start`], its log (stderr) going to `log` (a file, where a flood's warnings
    /// would drown the test's output).
    pub fn start_with_log(dir: &Path, interval: &str, args: &[&str], log: Stdio) -> Daemon {
        Daemon::start_with_env(dir, interval, args, log, &[])
    }

    /// As [`Daemon::start_with_log`], with `env` added to the daemon's environment.
    pub fn start_with_env(
        dir: &Path,
        interval: &str,
        args: &[&str],
        log: Stdio,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Daemon {
        let socket = dir.join("agent.sock");
        let port = free_port();
        let child = Command::new(agent_bin())
            .envs(env.iter().copied())
            .args(["run", "--no-calibrate", "--no-nvml", "--interval", interval])
            .arg("--socket")
            .arg(&socket)
            .arg(format!("--metrics-listen=127.0.0.1:{port}"))
            .args(args)
            .stderr(log)
            .spawn()
            .unwrap();
        wait_until(
            Duration::from_secs(30),
            || {
                UnixStream::connect(&socket).is_ok()
                    && TcpStream::connect(("127.0.0.1", port)).is_ok()
            },
            "the daemon's socket and /metrics",
        );
        Daemon {
            child,
            socket,
            port,
        }
    }

    /// The model, as the socket serves it.
    pub fn snapshot(&self) -> Value {
        let mut s = UnixStream::connect(&self.socket).unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        serde_json::from_str(&body).expect("a JSON snapshot")
    }

    /// One scrape of `/metrics` on a new connection: the body and how long it took.
    pub fn scrape(&self) -> (String, Duration) {
        let started = Instant::now();
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let took = started.elapsed();
        assert!(raw.starts_with("HTTP/1.1 200"), "{raw:.200}");
        let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
        (body, took)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, as a service manager stops it: its exit status and how long it took to exit, or
    /// `None` if it had not exited within `limit` (then it is killed, and the time it took to
    /// end after that is still waited for and returned).
    pub fn stop_within(mut self, limit: Duration) -> (Option<ExitStatus>, Duration) {
        let started = Instant::now();
        // SAFETY: kill(2) on our own child, not yet waited for.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (Some(status), started.elapsed());
            }
            if started.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return (None, started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGTERM, as a service manager stops it; its exit status.
    pub fn stop(mut self) -> ExitStatus {
        // SAFETY: kill(2) on our own child, not yet waited for.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap()
    }
}

impl Drop for Daemon {
    /// A failed assertion must not leave the daemon running (it holds the test's output pipe).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
