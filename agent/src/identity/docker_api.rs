//! A minimal Docker Engine API client: one `GET` over the Unix socket, HTTP/1.1 by hand, with a
//! deadline on connecting, writing and reading so a hung daemon cannot stall the agent.

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::{Duration, Instant},
};

use super::{
    container::ContainerId,
    names::{ContainerNames, NameLookupError, names_from_labels},
};

/// The largest response read; an inspect document is a few kilobytes.
const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// `GET /containers/<id>/json`: the container's name (without the leading `/`) and, for
/// containers the kubelet made through dockershim or cri-dockerd, the pod labels.
pub fn inspect_container(
    socket: &Path,
    id: &ContainerId,
    timeout: Duration,
) -> Result<ContainerNames, NameLookupError> {
    let body = get(socket, &format!("/containers/{id}/json"), timeout)?;
    let doc: serde_json::Value =
        serde_json::from_slice(&body).map_err(|source| NameLookupError::Json {
            what: format!("docker inspect of {}", id.short()),
            source,
        })?;
    let labels = doc
        .pointer("/Config/Labels")
        .and_then(serde_json::Value::as_object);
    let mut names = labels
        .map(|l| names_from_labels(|key| l.get(key).and_then(serde_json::Value::as_str)))
        .unwrap_or_default();
    if names.container_name.is_none() {
        names.container_name = doc
            .get("Name")
            .and_then(serde_json::Value::as_str)
            .map(|n| n.trim_start_matches('/').to_owned())
            .filter(|n| !n.is_empty());
    }
    Ok(names)
}

/// One HTTP/1.1 `GET` on a Unix socket, returning the body of a `200` response.
pub fn get(socket: &Path, target: &str, timeout: Duration) -> Result<Vec<u8>, NameLookupError> {
    let deadline = Instant::now() + timeout;
    let mut stream = connect(socket, timeout)?;
    let io = |source| NameLookupError::Socket {
        socket: socket.to_owned(),
        source,
    };
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let request = format!(
        "GET {target} HTTP/1.1\r\nHost: docker\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).map_err(io)?;

    let mut response = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(NameLookupError::Timeout {
                socket: socket.to_owned(),
                timeout,
            });
        }
        stream.set_read_timeout(Some(left)).map_err(io)?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(NameLookupError::Timeout {
                    socket: socket.to_owned(),
                    timeout,
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
        if response.len() > MAX_RESPONSE_BYTES {
            return Err(NameLookupError::Http {
                reason: format!("response larger than {MAX_RESPONSE_BYTES} bytes"),
            });
        }
        // With `Connection: close` the server ends the stream, but a complete response is
        // enough: don't wait for a slow close.
        if response_complete(&response) {
            break;
        }
    }
    parse_response(&response)
}

/// Connects with `SO_SNDTIMEO` set first: on Linux that bounds a blocking `connect` on a Unix
/// socket whose listener's backlog is full (`unix_stream_connect` waits `sk_sndtimeo`).
fn connect(socket: &Path, timeout: Duration) -> Result<UnixStream, NameLookupError> {
    let err = |source| NameLookupError::Socket {
        socket: socket.to_owned(),
        source,
    };
    let stream = crate::sys::socket::unix_stream().map_err(err)?;
    // `set_write_timeout` sets SO_SNDTIMEO, the timeout `connect` uses on a Unix socket.
    stream.set_write_timeout(Some(timeout)).map_err(err)?;
    crate::sys::socket::connect_unix(&stream, socket).map_err(|e| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            NameLookupError::Timeout {
                socket: socket.to_owned(),
                timeout,
            }
        } else {
            err(e)
        }
    })?;
    Ok(stream)
}

/// Whether `response` holds a whole response: headers and a body of the announced length, or
/// the final chunk of a chunked body.
fn response_complete(response: &[u8]) -> bool {
    let Some(head_end) = find(response, b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&response[..head_end]).to_ascii_lowercase();
    let body = &response[head_end + 4..];
    if let Some(len) = header(&head, "content-length").and_then(|v| v.parse::<usize>().ok()) {
        return body.len() >= len;
    }
    header(&head, "transfer-encoding").is_some_and(|v| v.contains("chunked"))
        && find(body, b"0\r\n\r\n").is_some_and(|at| at == 0 || body[..at].ends_with(b"\r\n"))
}

fn parse_response(response: &[u8]) -> Result<Vec<u8>, NameLookupError> {
    let malformed = |reason: &str| NameLookupError::Http {
        reason: reason.to_owned(),
    };
    let head_end = find(response, b"\r\n\r\n").ok_or_else(|| malformed("no end of headers"))?;
    let head = String::from_utf8_lossy(&response[..head_end]).into_owned();
    let status_line = head.lines().next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| malformed("no status code"))?;
    if status != 200 {
        return Err(NameLookupError::Http {
            reason: format!("status {status} ({})", status_line.trim()),
        });
    }
    let lower = head.to_ascii_lowercase();
    let body = &response[head_end + 4..];
    if header(&lower, "transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        return dechunk(body).ok_or_else(|| malformed("bad chunked body"));
    }
    match header(&lower, "content-length").and_then(|v| v.parse::<usize>().ok()) {
        Some(len) => body
            .get(..len)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| malformed("body shorter than its content-length")),
        None => Ok(body.to_vec()),
    }
}

/// The value of a header in a lowercased header block.
fn header<'a>(lower_head: &'a str, name: &str) -> Option<&'a str> {
    lower_head.lines().skip(1).find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == name).then(|| v.trim())
    })
}

fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = find(body, b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use std::{io::BufRead, os::unix::net::UnixListener, thread};

    use super::*;

    const ID: &str = "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d";

    /// A server that answers one request with `response` after reading the request head, and
    /// returns the request line it got.
    fn serve_once(listener: UnixListener, response: Vec<u8>) -> thread::JoinHandle<String> {
        thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = std::io::BufReader::new(stream);
            let mut request_line = String::new();
            reader.read_line(&mut request_line).unwrap();
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap() > 2 {
                line.clear();
            }
            reader.get_mut().write_all(&response).unwrap();
            request_line
        })
    }

    fn http_ok(body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    #[test]
    fn inspects_a_plain_docker_container() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("docker.sock");
        let server = serve_once(
            UnixListener::bind(&sock).unwrap(),
            http_ok(r#"{"Id":"x","Name":"/jupyter","Config":{"Labels":{"maintainer":"me"}}}"#),
        );
        let id = ContainerId::parse(ID).unwrap();
        let names = inspect_container(&sock, &id, Duration::from_millis(500)).unwrap();
        assert_eq!(names.container_name.as_deref(), Some("jupyter"));
        assert_eq!(names.pod, None);
        assert_eq!(
            server.join().unwrap(),
            format!("GET /containers/{ID}/json HTTP/1.1\r\n")
        );
    }

    #[test]
    fn reads_kubernetes_labels_from_a_chunked_response() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("docker.sock");
        let body = r#"{"Name":"/k8s_trainer_resnet-0_ml_3d274242-8ee0-11e9-a8a6-1e68d864ef1a_0","Config":{"Labels":{"io.kubernetes.container.name":"trainer","io.kubernetes.pod.name":"resnet-0","io.kubernetes.pod.namespace":"ml"}}}"#;
        let (a, b) = body.split_at(40);
        let chunked = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        );
        let server = serve_once(UnixListener::bind(&sock).unwrap(), chunked.into_bytes());
        let names = inspect_container(
            &sock,
            &ContainerId::parse(ID).unwrap(),
            Duration::from_millis(500),
        )
        .unwrap();
        server.join().unwrap();
        assert_eq!(names.container_name.as_deref(), Some("trainer"));
        let pod = names.pod.unwrap();
        assert_eq!(
            (pod.namespace.as_str(), pod.name.as_str()),
            ("ml", "resnet-0")
        );
    }

    #[test]
    fn a_missing_container_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("docker.sock");
        let body = r#"{"message":"No such container"}"#;
        let response = format!(
            "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let server = serve_once(UnixListener::bind(&sock).unwrap(), response.into_bytes());
        let err = inspect_container(
            &sock,
            &ContainerId::parse(ID).unwrap(),
            Duration::from_millis(500),
        )
        .unwrap_err();
        server.join().unwrap();
        assert!(err.to_string().contains("404"), "{err}");
    }

    #[test]
    fn a_hung_daemon_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("docker.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        // Accepts, reads, never answers; keeps the connection open until the test ends.
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let server = thread::spawn(move || {
            let (_stream, _) = listener.accept().unwrap();
            let _ = done_rx.recv();
        });
        let started = Instant::now();
        let err = get(&sock, "/containers/x/json", Duration::from_millis(200)).unwrap_err();
        let waited = started.elapsed();
        done_tx.send(()).unwrap();
        server.join().unwrap();
        assert!(matches!(err, NameLookupError::Timeout { .. }), "{err}");
        assert!(waited >= Duration::from_millis(190), "{waited:?}");
        assert!(waited < Duration::from_secs(2), "{waited:?}");
    }

    #[test]
    fn no_socket_is_an_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let err = get(
            &dir.path().join("absent.sock"),
            "/x",
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(matches!(err, NameLookupError::Socket { .. }), "{err}");
    }

    #[test]
    fn response_parsing() {
        assert_eq!(parse_response(&http_ok("{}")).unwrap(), b"{}");
        assert!(parse_response(b"garbage").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort").is_err());
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").as_deref(),
            Some(&b"abcde"[..])
        );
        assert_eq!(dechunk(b"zz\r\n"), None);
        assert!(response_complete(&http_ok("{}")));
        assert!(!response_complete(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab"
        ));
    }
}
