//! A tiny blocking HTTP/1.1 server for memlens's local endpoints (`memlens
//! top --serve`'s metrics, `memlens report --serve`'s page and its states):
//! one connection at a time, each closed after its answer, GET and HEAD only.
//!
//! Both are read by one client on the same machine (a Prometheus scrape every
//! few seconds, one browser tab), so std::net keeps memlens free of an HTTP
//! stack. A client that sends nothing is dropped after [`READ_TIMEOUT`], so it
//! cannot stall the next request for long.

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
    /// A plain-text answer.
    pub fn text(status: u16, body: &str) -> Self {
        Response::typed(status, "text/plain; charset=utf-8", body.to_string())
    }

    /// An answer of `content_type`.
    pub fn typed(status: u16, content_type: &str, body: String) -> Self {
        Response {
            status,
            content_type: content_type.to_string(),
            body,
        }
    }
}

/// A request: its method and its path, the query split off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// `GET`, `HEAD`, ...
    pub method: &'a str,
    /// The path without its query.
    pub path: &'a str,
    /// The query (after `?`), empty when none.
    pub query: &'a str,
}

impl<'a> Request<'a> {
    /// The value of `name` in the query (`event=12` -> `Some("12")`).
    pub fn param(&self, name: &str) -> Option<&'a str> {
        self.query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }
}

/// A bound listener.
pub struct Server {
    listener: TcpListener,
}

impl Server {
    /// Binds `addr` (`127.0.0.1:9400`; port 0 picks a free one).
    pub fn bind(addr: &str) -> std::io::Result<Self> {
        Ok(Server {
            listener: TcpListener::bind(addr)?,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Answers connections one at a time with `handler` (asked only for GET
    /// and HEAD; other methods get 405) until `handler` returns `false` as
    /// its second value (after that answer is sent).
    pub fn serve(&self, mut handler: impl FnMut(&Request<'_>) -> (Response, bool)) {
        for conn in self.listener.incoming() {
            let Ok(stream) = conn else { continue };
            if !answer(stream, &mut handler) {
                break;
            }
        }
    }
}

/// Answers one connection; false when the handler said to stop.
fn answer(
    mut stream: TcpStream,
    handler: &mut impl FnMut(&Request<'_>) -> (Response, bool),
) -> bool {
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
            return true;
        }
    };
    let (method, target) = request_line(&head);
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let req = Request {
        method,
        path,
        query,
    };
    let (resp, go_on) = if method == "GET" || method == "HEAD" {
        handler(&req)
    } else {
        (Response::text(405, "only GET\n"), true)
    };
    write_response(&mut stream, &resp, method == "HEAD");
    go_on
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

/// `(method, target)` of the request line (empty strings when malformed).
fn request_line(head: &str) -> (&str, &str) {
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    (parts.next().unwrap_or(""), parts.next().unwrap_or(""))
}

fn write_response(stream: &mut TcpStream, r: &Response, head_only: bool) {
    let reason = match r.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let mut out = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
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

    #[test]
    fn query_parameters_are_found_by_name() {
        let r = Request {
            method: "GET",
            path: "/api/state",
            query: "x=1&event=42",
        };
        assert_eq!(r.param("event"), Some("42"));
        assert_eq!(r.param("x"), Some("1"));
        assert_eq!(r.param("y"), None);
    }
}
