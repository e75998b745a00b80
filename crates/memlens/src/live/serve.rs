//! A tiny blocking HTTP/1.1 server for `memlens top --serve ADDR`: `GET
//! /metrics` answers the OpenMetrics text of a fresh sample, `GET /` a line
//! saying where the metrics are; anything else 404 (405 for other methods).
//!
//! One connection at a time, each closed after its answer: a Prometheus
//! scrape every few seconds needs no more, and std::net keeps memlens free of
//! an HTTP stack. A client that sends nothing is dropped after
//! [`READ_TIMEOUT`], so it cannot stall the next scrape for long.

use super::LiveError;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// How long a client may take to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest request head read; a longer one is answered 431.
const MAX_HEAD: usize = 16 * 1024;

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The HTTP status code.
    pub status: u16,
    /// The `Content-Type`.
    pub content_type: String,
    /// The body.
    pub body: String,
}

impl Response {
    fn text(status: u16, body: &str) -> Self {
        Response {
            status,
            content_type: "text/plain; charset=utf-8".to_string(),
            body: body.to_string(),
        }
    }
}

/// A bound metrics endpoint.
pub struct MetricsServer {
    listener: TcpListener,
}

impl MetricsServer {
    /// Binds `addr` (`127.0.0.1:9400`; port 0 picks a free one).
    pub fn bind(addr: &str) -> Result<Self, LiveError> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| LiveError::Usage(format!("--serve {addr}: cannot listen: {e}")))?;
        Ok(MetricsServer { listener })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> Result<SocketAddr, LiveError> {
        self.listener
            .local_addr()
            .map_err(|e| LiveError::Usage(format!("--serve: {e}")))
    }

    /// Answers connections one at a time. `scrape` makes the `/metrics` body
    /// (an error becomes a 503 with its message); `served` is told after each
    /// `/metrics` answer and returns false to stop.
    pub fn serve(
        &self,
        mut scrape: impl FnMut() -> Result<String, LiveError>,
        mut served: impl FnMut() -> bool,
    ) -> Result<(), LiveError> {
        for conn in self.listener.incoming() {
            let Ok(stream) = conn else { continue };
            if handle(stream, &mut scrape) && !served() {
                break;
            }
        }
        Ok(())
    }
}

/// Answers one connection; true when it was a `/metrics` scrape.
fn handle(mut stream: TcpStream, scrape: &mut impl FnMut() -> Result<String, LiveError>) -> bool {
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let _ = stream.set_write_timeout(Some(READ_TIMEOUT));
    let head = match read_head(&mut stream) {
        Ok(h) => h,
        Err(too_long) => {
            if too_long {
                write_response(
                    &mut stream,
                    &Response::text(431, "request head too large\n"),
                    false,
                );
            }
            return false;
        }
    };
    let (method, path) = request_line(&head);
    let (resp, is_scrape) = route(method, path, scrape);
    write_response(&mut stream, &resp, method == "HEAD");
    is_scrape
}

/// The answer to `method path`, and whether it was a scrape.
pub fn route(
    method: &str,
    path: &str,
    scrape: &mut impl FnMut() -> Result<String, LiveError>,
) -> (Response, bool) {
    let path = path.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return (Response::text(405, "only GET\n"), false);
    }
    match path {
        "/metrics" => match scrape() {
            Ok(body) => (
                Response {
                    status: 200,
                    content_type: super::openmetrics::CONTENT_TYPE.to_string(),
                    body,
                },
                true,
            ),
            Err(e) => (Response::text(503, &format!("memlens: {e}\n")), true),
        },
        "/" => (
            Response::text(200, "memlens top: OpenMetrics at /metrics\n"),
            false,
        ),
        _ => (Response::text(404, "not found; try /metrics\n"), false),
    }
}

/// Reads up to the blank line ending the request head. Err(true) when it is
/// too long, Err(false) when the client went away or timed out.
fn read_head(stream: &mut TcpStream) -> Result<String, bool> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).map_err(|_| false)?;
        if n == 0 {
            return Err(false);
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
        if buf.len() > MAX_HEAD {
            return Err(true);
        }
    }
}

/// `(method, path)` of the request line (empty strings when malformed).
fn request_line(head: &str) -> (&str, &str) {
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    (parts.next().unwrap_or(""), parts.next().unwrap_or(""))
}

fn write_response(stream: &mut TcpStream, r: &Response, head_only: bool) {
    let reason = match r.status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let mut out = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        r.status,
        r.content_type,
        r.body.len()
    );
    if !head_only {
        out.push_str(&r.body);
    }
    // The client may have gone; nothing to do about it.
    let _ = stream.write_all(out.as_bytes());
    let _ = stream.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_then_stops_when_told() {
        let server = MetricsServer::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut n = 0;
            server
                .serve(
                    || {
                        n += 1;
                        Ok(format!("m {n}\n# EOF\n"))
                    },
                    {
                        let mut left = 2;
                        move || {
                            left -= 1;
                            left > 0
                        }
                    },
                )
                .unwrap();
        });
        let home = get(addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(home.starts_with("HTTP/1.1 200 OK\r\n"), "{home}");
        assert!(home.ends_with("OpenMetrics at /metrics\n"));
        let missing = get(addr, "GET /nope HTTP/1.1\r\n\r\n");
        assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
        let post = get(addr, "POST /metrics HTTP/1.1\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
        let one = get(addr, "GET /metrics?x=1 HTTP/1.1\r\n\r\n");
        assert!(one.contains("Content-Type: application/openmetrics-text; version=1.0.0"));
        assert!(one.contains("Content-Length: 10\r\n"), "{one}");
        assert!(one.ends_with("\r\n\r\nm 1\n# EOF\n"), "{one}");
        let two = get(addr, "GET /metrics HTTP/1.0\r\n\r\n");
        assert!(two.ends_with("m 2\n# EOF\n"), "{two}");
        t.join().unwrap();
        assert!(TcpStream::connect(addr).is_err(), "stopped after 2 scrapes");
    }

    #[test]
    fn a_failing_scrape_is_a_503() {
        let (r, scraped) = route("GET", "/metrics", &mut || {
            Err(LiveError::Source("driver gone".into()))
        });
        assert_eq!((r.status, scraped), (503, true));
        assert_eq!(r.body, "memlens: NVML: driver gone\n");
    }
}
