//! `memlens top --serve ADDR`: `GET /metrics` answers the OpenMetrics text
//! of a fresh sample, `GET /` a line saying where the metrics are; anything
//! else 404 (405 for other methods), over memlens's tiny HTTP server
//! ([`crate::http`]).

use super::LiveError;
use crate::http::{Request, Server};
pub use crate::http::{Response, READ_TIMEOUT};
use std::net::SocketAddr;

/// A bound metrics endpoint.
pub struct MetricsServer {
    server: Server,
}

impl MetricsServer {
    /// Binds `addr` (`127.0.0.1:9400`; port 0 picks a free one).
    pub fn bind(addr: &str) -> Result<Self, LiveError> {
        let server = Server::bind(addr)
            .map_err(|e| LiveError::Usage(format!("--serve {addr}: cannot listen: {e}")))?;
        Ok(MetricsServer { server })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> Result<SocketAddr, LiveError> {
        self.server
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
        self.server.serve(|req: &Request<'_>| {
            let (resp, is_scrape) = route(req.method, req.path, &mut scrape);
            let go_on = !is_scrape || served();
            (resp, go_on)
        });
        Ok(())
    }
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
                Response::typed(200, super::openmetrics::CONTENT_TYPE, body),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

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
