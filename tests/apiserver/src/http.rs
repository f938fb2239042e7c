//! A small HTTP/1.1 server layer over a blocking byte stream (plain TCP or a rustls stream).
//!
//! Only what Kubernetes clients need: request line, headers, `Content-Length` or chunked request
//! bodies, keep-alive, fixed-length responses and chunked streaming responses for watches. One OS
//! thread serves one connection; the caller decides what to do with each parsed request.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};

use crate::util::percent_decode;

/// Largest request head or body accepted; Kubernetes objects are far smaller.
const MAX_HEAD: usize = 64 * 1024;
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Anything a connection can be served over.
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// One client connection: the (possibly TLS) stream, the raw socket for shutdown, and bytes read
/// ahead of the current request.
pub struct Conn {
    stream: Box<dyn Stream>,
    socket: TcpStream,
    buf: Vec<u8>,
}

/// A parsed request.
#[derive(Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    /// Header names lowercased.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .get(name)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    /// The client asked to close the connection after this request.
    pub fn wants_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"))
    }
}

impl Conn {
    pub fn new(stream: Box<dyn Stream>, socket: TcpStream) -> Conn {
        Conn {
            stream,
            socket,
            buf: Vec::new(),
        }
    }

    /// A handle on the socket that can end the connection from another place.
    pub fn socket(&self) -> &TcpStream {
        &self.socket
    }

    /// Closes the TCP connection in both directions, without any HTTP-level goodbye.
    pub fn abort(&self) {
        let _ = self.socket.shutdown(Shutdown::Both);
    }

    /// Whether the client has closed its side (checked without blocking; data waiting to be
    /// read counts as open).
    pub fn peer_closed(&self) -> bool {
        if self.socket.set_nonblocking(true).is_err() {
            return false;
        }
        let mut byte = [0u8; 1];
        let closed = matches!(self.socket.peek(&mut byte), Ok(0));
        let _ = self.socket.set_nonblocking(false);
        closed
    }

    fn fill(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 8192];
        let n = self.stream.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    fn take_line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(pos) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[..pos].to_vec();
                self.buf.drain(..pos + 2);
                return Ok(line);
            }
            if self.buf.len() > MAX_HEAD {
                return Err(invalid("request line or header too long"));
            }
            if !self.fill()? {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed",
                ));
            }
        }
    }

    fn take_exact(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            if !self.fill()? {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "body truncated",
                ));
            }
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// Reads the next request. `Ok(None)` means the client closed the connection cleanly.
    pub fn read_request(&mut self) -> io::Result<Option<Request>> {
        if self.buf.is_empty() && !self.fill()? {
            return Ok(None);
        }
        let line = self.take_line()?;
        let line = String::from_utf8(line).map_err(|_| invalid("request line is not UTF-8"))?;
        let mut parts = line.split(' ');
        let (method, target) = match (parts.next(), parts.next(), parts.next()) {
            (Some(m), Some(t), Some(v)) if v.starts_with("HTTP/1.") => (m.to_string(), t),
            _ => return Err(invalid(&format!("malformed request line {line:?}"))),
        };
        let (path, query) = split_target(target);
        let mut headers = BTreeMap::new();
        loop {
            let h = self.take_line()?;
            if h.is_empty() {
                break;
            }
            let h = String::from_utf8_lossy(&h).into_owned();
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let chunked = headers
            .get("transfer-encoding")
            .is_some_and(|t| t.to_ascii_lowercase().contains("chunked"));
        let body = if chunked {
            self.read_chunked_body()?
        } else {
            let len: usize = match headers.get("content-length") {
                Some(v) => v.parse().map_err(|_| invalid("bad Content-Length"))?,
                None => 0,
            };
            if len > MAX_BODY {
                return Err(invalid("request body too large"));
            }
            self.take_exact(len)?
        };
        Ok(Some(Request {
            method,
            path,
            query,
            headers,
            body,
        }))
    }

    fn read_chunked_body(&mut self) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let size_line = String::from_utf8_lossy(&self.take_line()?).into_owned();
            let size_hex = size_line.split(';').next().unwrap_or("").trim();
            let size =
                usize::from_str_radix(size_hex, 16).map_err(|_| invalid("bad chunk size"))?;
            if size == 0 {
                // Trailers, then the empty line.
                while !self.take_line()?.is_empty() {}
                return Ok(body);
            }
            if body.len() + size > MAX_BODY {
                return Err(invalid("request body too large"));
            }
            body.extend(self.take_exact(size)?);
            self.take_line()?;
        }
    }

    /// Writes a complete response with a `Content-Length`.
    pub fn write_response(
        &mut self,
        code: u16,
        content_type: &str,
        extra_headers: &[(&str, String)],
        body: &[u8],
    ) -> io::Result<()> {
        let mut head = format!(
            "HTTP/1.1 {code} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
             Cache-Control: no-cache, private\r\n",
            reason_phrase(code),
            body.len()
        );
        for (k, v) in extra_headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        out.extend_from_slice(body);
        self.stream.write_all(&out)?;
        self.stream.flush()
    }

    /// Starts a chunked streaming response (used by watches).
    pub fn start_chunked(&mut self, code: u16, content_type: &str) -> io::Result<()> {
        let head = format!(
            "HTTP/1.1 {code} {}\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n\
             Cache-Control: no-cache, private\r\n\r\n",
            reason_phrase(code)
        );
        self.stream.write_all(head.as_bytes())?;
        self.stream.flush()
    }

    /// Sends one chunk and flushes it to the client.
    pub fn write_chunk(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let mut out = format!("{:x}\r\n", data.len()).into_bytes();
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
        self.stream.write_all(&out)?;
        self.stream.flush()
    }

    /// Ends a chunked response cleanly.
    pub fn finish_chunked(&mut self) -> io::Result<()> {
        self.stream.write_all(b"0\r\n\r\n")?;
        self.stream.flush()
    }
}

fn split_target(target: &str) -> (String, BTreeMap<String, String>) {
    let (path, qs) = target.split_once('?').unwrap_or((target, ""));
    let mut query = BTreeMap::new();
    for pair in qs.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        query.insert(percent_decode(k), percent_decode(v));
    }
    let path = percent_decode(&path.replace('+', "%2B"));
    (path, query)
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        409 => "Conflict",
        410 => "Gone",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_splitting_decodes_selectors() {
        let (path, q) = split_target("/api/v1/pods?labelSelector=app%3Dweb%2Ctier+in+(a)&watch=1");
        assert_eq!(path, "/api/v1/pods");
        assert_eq!(q["labelSelector"], "app=web,tier in (a)");
        assert_eq!(q["watch"], "1");
    }
}
