//! A deliberately small HTTP/1.1 server side: read one request (with size limits), write one
//! response, close. The agent serves a handful of calls from one controller, so keep-alive,
//! chunked request bodies and pipelining are not worth their attack surface.

use std::io::{self, BufRead, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A connection whose reads give up at a deadline: each read waits for what is left of it (at
/// most `io_timeout`), so a peer trickling a byte now and then cannot hold the connection for
/// longer than the deadline, as it could with a timeout per read alone.
pub struct Deadline<S> {
    pub inner: S,
    deadline: Instant,
    io_timeout: Duration,
}

/// A stream over a TCP socket, whose read timeout [`Deadline`] sets.
pub trait OverTcp {
    fn tcp(&self) -> &TcpStream;
}

impl OverTcp for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl OverTcp for rustls::StreamOwned<rustls::ServerConnection, TcpStream> {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }
}

impl<S: OverTcp> Deadline<S> {
    pub fn new(inner: S, deadline: Instant, io_timeout: Duration) -> Deadline<S> {
        Deadline {
            inner,
            deadline,
            io_timeout,
        }
    }

    /// Moves the deadline (for the next part of the request).
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }
}

impl<S: Read + OverTcp> Read for Deadline<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the request was not received in time",
            ));
        }
        self.inner
            .tcp()
            .set_read_timeout(Some(left.min(self.io_timeout)))?;
        // A socket timeout is reported as WouldBlock on Linux: the same thing, said once.
        self.inner.read(buf).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                io::ErrorKind::TimedOut,
                "the request was not received in time",
            ),
            _ => e,
        })
    }
}

impl<S: Write> Write for Deadline<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Size limits for one request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_head_bytes: usize,
    pub max_headers: usize,
    pub max_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_head_bytes: 16 * 1024,
            max_headers: 100,
            max_body_bytes: 64 * 1024 * 1024,
        }
    }
}

/// A request line and headers.
#[derive(Debug, Clone)]
pub struct Head {
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The value of a query parameter (`?dry_run=1`), without percent-decoding: the agent's
    /// parameters are plain words.
    pub fn query_param(&self, name: &str) -> Option<&str> {
        self.query
            .split('&')
            .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }
}

/// Why a request could not be read; each maps to a status the client is told.
#[derive(Debug)]
pub enum ReadError {
    /// The connection closed before a request started.
    Closed,
    Io(io::Error),
    /// 400 with a message.
    Malformed(String),
    /// 431
    HeadTooLarge,
    /// 413, with the announced length.
    BodyTooLarge(usize),
    /// 411: a body without Content-Length (chunked uploads are not accepted).
    LengthRequired,
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> ReadError {
        ReadError::Io(e)
    }
}

/// Reads one line (up to `budget` bytes, CRLF or LF terminated) without the terminator.
fn read_line<R: BufRead>(r: &mut R, budget: &mut usize) -> Result<Option<String>, ReadError> {
    let mut line = Vec::new();
    let n = r.take(*budget as u64 + 1).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if n > *budget || !line.ends_with(b"\n") {
        return Err(if n > *budget {
            ReadError::HeadTooLarge
        } else {
            ReadError::Malformed("truncated request head".into())
        });
    }
    *budget -= n;
    line.pop();
    if line.ends_with(b"\r") {
        line.pop();
    }
    String::from_utf8(line)
        .map(Some)
        .map_err(|_| ReadError::Malformed("request head is not UTF-8".into()))
}

/// Reads the request line and headers.
pub fn read_head<R: BufRead>(r: &mut R, limits: &Limits) -> Result<Head, ReadError> {
    let mut budget = limits.max_head_bytes;
    let request_line = read_line(r, &mut budget)?.ok_or(ReadError::Closed)?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Malformed(format!(
            "bad request line {request_line:?}"
        )));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(ReadError::Malformed(format!(
            "unsupported protocol {version:?}"
        )));
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut headers = Vec::new();
    loop {
        let line = read_line(r, &mut budget)?.ok_or_else(|| {
            ReadError::Malformed("connection closed inside the request head".into())
        })?;
        if line.is_empty() {
            break;
        }
        if headers.len() >= limits.max_headers {
            return Err(ReadError::HeadTooLarge);
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| ReadError::Malformed(format!("bad header line {line:?}")))?;
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    Ok(Head {
        method: method.into(),
        path: path.into(),
        query: query.into(),
        headers,
    })
}

/// The announced body length, checked against the limit. Bodies must carry Content-Length.
pub fn body_length(head: &Head, limits: &Limits) -> Result<usize, ReadError> {
    if head.header("transfer-encoding").is_some() {
        return Err(ReadError::LengthRequired);
    }
    let len = match head.header("content-length") {
        None => 0,
        Some(v) => v
            .parse::<usize>()
            .map_err(|_| ReadError::Malformed(format!("bad Content-Length {v:?}")))?,
    };
    if len > limits.max_body_bytes {
        return Err(ReadError::BodyTooLarge(len));
    }
    Ok(len)
}

/// Reads exactly `len` body bytes, giving up at `deadline`.
///
/// The buffer grows as bytes arrive (at most 1 MiB ahead of them), so an announced length alone
/// does not reserve memory.
pub fn read_body<R: Read>(r: &mut R, len: usize, deadline: Instant) -> Result<Vec<u8>, ReadError> {
    const STEP: usize = 1 << 20;
    let mut body = Vec::new();
    let mut filled = 0;
    while filled < len {
        if body.len() == filled {
            body.resize(len.min(filled + STEP), 0);
        }
        if Instant::now() > deadline {
            return Err(ReadError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "request body took too long",
            )));
        }
        let n = r.read(&mut body[filled..])?;
        if n == 0 {
            return Err(ReadError::Malformed(format!(
                "body ended after {filled} of {len} bytes"
            )));
        }
        filled += n;
    }
    Ok(body)
}

/// One response. Always `Connection: close`.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json<T: serde::Serialize>(status: u16, value: &T) -> Response {
        let mut body = serde_json::to_vec_pretty(value).unwrap_or_else(|e| {
            format!("{{\"error\":\"internal\",\"detail\":\"encode: {e}\"}}").into_bytes()
        });
        body.push(b'\n');
        Response {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body,
        }
    }

    pub fn text(status: u16, text: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: text.into().into_bytes(),
        }
    }

    /// A JSON error body `{"error", "detail"}`.
    pub fn error(status: u16, error: &str, detail: impl Into<String>) -> Response {
        Response::json(status, &crate::protocol::ErrorBody::new(error, detail))
    }

    pub fn with_header(mut self, name: &str, value: impl Into<String>) -> Response {
        self.headers.push((name.into(), value.into()));
        self
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        423 => "Locked",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Writes the response and flushes.
pub fn write_response<W: Write>(w: &mut W, resp: &Response) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        resp.status,
        reason(resp.status),
        resp.content_type,
        resp.body.len()
    );
    for (k, v) in &resp.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())?;
    w.write_all(&resp.body)?;
    w.flush()
}

/// Tells a client that sent `Expect: 100-continue` to go ahead with the body.
pub fn write_continue<W: Write>(w: &mut W) -> io::Result<()> {
    w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer sending a header byte every 100 ms never waits out a read timeout of 1 s; the
    /// deadline still ends the head at 500 ms.
    #[test]
    fn a_trickled_head_ends_at_the_deadline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let _ = s.write_all(b"GET / HTTP/1.1\r\n");
            for _ in 0..30 {
                std::thread::sleep(Duration::from_millis(100));
                if s.write_all(b"x").is_err() {
                    break;
                }
            }
        });
        let (conn, _) = listener.accept().unwrap();
        let started = Instant::now();
        let mut r = io::BufReader::new(Deadline::new(
            conn,
            started + Duration::from_millis(500),
            Duration::from_secs(1),
        ));
        let read = read_head(&mut r, &Limits::default());
        let took = started.elapsed();
        assert!(
            matches!(&read, Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::TimedOut),
            "{read:?}"
        );
        assert!(took < Duration::from_millis(1500), "{took:?}");
        drop(r);
        peer.join().unwrap();
    }

    #[test]
    fn reads_head_and_body_with_limits() {
        let raw = b"PUT /v1/bundle?dry_run=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nIf-Match: *\r\n\r\nbody";
        let mut r = io::BufReader::new(&raw[..]);
        let limits = Limits::default();
        let head = read_head(&mut r, &limits).unwrap();
        assert_eq!(
            (head.method.as_str(), head.path.as_str()),
            ("PUT", "/v1/bundle")
        );
        assert_eq!(head.query_param("dry_run"), Some("1"));
        assert_eq!(head.header("if-match"), Some("*"));
        let len = body_length(&head, &limits).unwrap();
        assert_eq!(
            read_body(
                &mut r,
                len,
                Instant::now() + std::time::Duration::from_secs(1)
            )
            .unwrap(),
            b"body"
        );

        let small = Limits {
            max_body_bytes: 3,
            ..limits
        };
        assert!(matches!(
            body_length(&head, &small),
            Err(ReadError::BodyTooLarge(4))
        ));
        let tiny = Limits {
            max_head_bytes: 20,
            ..limits
        };
        assert!(matches!(
            read_head(&mut io::BufReader::new(&raw[..]), &tiny),
            Err(ReadError::HeadTooLarge)
        ));
        // A body that ends before its announced length is refused with the count that arrived.
        let mut short = io::BufReader::new(&b"abc"[..]);
        let deadline = Instant::now() + std::time::Duration::from_secs(1);
        match read_body(&mut short, 60_000_000, deadline) {
            Err(ReadError::Malformed(m)) => assert!(m.contains("after 3 of 60000000"), "{m}"),
            other => panic!("{other:?}"),
        }
        let bad = b"GARBAGE\r\n\r\n";
        assert!(matches!(
            read_head(&mut io::BufReader::new(&bad[..]), &limits),
            Err(ReadError::Malformed(_))
        ));
    }
}
