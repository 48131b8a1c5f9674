//! A real Prometheus (Debian's package, installed by `cargo xtask setup`) on a free port that
//! scrapes agents every second, and queries through its HTTP API.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::wait_until;

pub const PROMETHEUS: &str = "/usr/bin/prometheus";
pub const PROMTOOL: &str = "/usr/bin/promtool";

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A plain HTTP/1.0 GET on 127.0.0.1; (status, body).
pub fn http_get(port: u16, target: &str) -> std::io::Result<(u16, String)> {
    get_on(TcpStream::connect(("127.0.0.1", port))?, target)
}

/// A plain HTTP/1.0 GET of `target` on a connected stream; (status, body).
pub fn get_on(mut s: TcpStream, target: &str) -> std::io::Result<(u16, String)> {
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {target} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_owned()))
}

pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Kills and reaps a child on drop (every process the tests start).
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct Prometheus {
    _child: Reaped,
    pub port: u16,
}

impl Prometheus {
    /// Scrapes each of `targets` (ports on 127.0.0.1) every second, as job `vgpu-agent`.
    pub fn start(dir: &Path, targets: &[u16]) -> Prometheus {
        assert!(
            Path::new(PROMETHEUS).exists() && Path::new(PROMTOOL).exists(),
            "Debian's prometheus package is missing: run `cargo xtask setup`"
        );
        let config = dir.join("prometheus.yml");
        let targets: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: vgpu-agent\n    scrape_interval: 1s\n    \
                 scrape_timeout: 900ms\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )
        .unwrap();
        let port = free_port();
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("prometheus starts (cargo xtask setup installs it)");
        let p = Prometheus {
            _child: Reaped(child),
            port,
        };
        wait_until(
            Duration::from_secs(60),
            || http_get(port, "/-/ready").is_ok_and(|(s, _)| s == 200),
            "Prometheus to be ready",
        );
        p
    }

    /// An instant query; the result vector.
    pub fn query(&self, q: &str) -> Vec<Value> {
        let (status, body) =
            http_get(self.port, &format!("/api/v1/query?query={}", urlencode(q))).unwrap();
        assert_eq!(status, 200, "{q}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{q}: {body}");
        v["data"]["result"].as_array().unwrap().clone()
    }

    /// The single value of a query that returns one series, once it does.
    pub fn value_when(&self, q: &str, want: impl Fn(f64) -> bool, timeout: Duration) -> f64 {
        let deadline = Instant::now() + timeout;
        let mut last = vec![];
        while Instant::now() < deadline {
            last = self.query(q);
            if let [one] = last.as_slice() {
                let v: f64 = one["value"][1].as_str().unwrap().parse().unwrap();
                if want(v) {
                    return v;
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("{q}: no wanted value within {timeout:?}; last result {last:?}");
    }
}
