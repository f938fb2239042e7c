//! Listening sockets. `[::]:PORT`, the default of every HAPTIC listener, takes connections of
//! both address families (Linux's `net.ipv6.bindv6only` is 0 by default, and a pod's network
//! namespace starts with the default), so one image serves IPv4-only, dual-stack and IPv6-only
//! clusters. Where the kernel has no IPv6 at all (booted with `ipv6.disable=1`) it listens on
//! `0.0.0.0:PORT` instead. Any other address is taken as given.

use std::io;
use std::net::TcpListener;

/// Binds `addr`; `[::]:PORT` falls back to `0.0.0.0:PORT` when the kernel has no IPv6. Returns
/// the listener and the address it listens on.
pub fn listen(addr: &str) -> io::Result<(TcpListener, String)> {
    match TcpListener::bind(addr) {
        Ok(listener) => Ok((listener, addr.to_string())),
        Err(e) => match addr.strip_prefix("[::]:") {
            Some(port) if no_ipv6(&e) => {
                let v4 = format!("0.0.0.0:{port}");
                log::info!("IPv6 is not available ({e}): listening on {v4} only");
                TcpListener::bind(&v4).map(|listener| (listener, v4))
            }
            _ => Err(e),
        },
    }
}

/// The errors of an IPv6 socket on a kernel without IPv6: `EAFNOSUPPORT` (no IPv6 at all) and
/// `EADDRNOTAVAIL` (IPv6 without the any address).
fn no_ipv6(e: &io::Error) -> bool {
    const EAFNOSUPPORT: i32 = 97;
    const EADDRNOTAVAIL: i32 = 99;
    matches!(e.raw_os_error(), Some(EAFNOSUPPORT | EADDRNOTAVAIL))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    #[test]
    fn the_any_address_takes_both_families() {
        let (listener, addr) = listen("[::]:0").unwrap();
        assert_eq!(addr, "[::]:0");
        let port = listener.local_addr().unwrap().port();
        for client in [format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
            let mut conn = TcpStream::connect(&client).unwrap_or_else(|e| panic!("{client}: {e}"));
            conn.write_all(b"x").unwrap();
            let (mut accepted, _) = listener.accept().unwrap();
            let mut byte = [0u8; 1];
            accepted.read_exact(&mut byte).unwrap();
            assert_eq!(&byte, b"x", "{client}");
        }
    }

    #[test]
    fn only_a_missing_ipv6_falls_back() {
        assert!(no_ipv6(&io::Error::from_raw_os_error(97)));
        assert!(no_ipv6(&io::Error::from_raw_os_error(99)));
        assert!(
            !no_ipv6(&io::Error::from_raw_os_error(98)),
            "EADDRINUSE is an error"
        );
        // A port in use stays an error, with no fallback that would hide it.
        let (taken, _) = listen("[::]:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let err = listen(&format!("[::]:{port}")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        // Other addresses are taken as given.
        assert!(listen("127.0.0.1:0").unwrap().1 == "127.0.0.1:0");
    }
}
