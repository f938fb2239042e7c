//! Test helpers on the OS level, shared by the workspace's test crates (included with
//! `#[path]` by `tests/support/mod.rs` too): loopback addresses of a test's own, children that
//! die with their test, and connections from a chosen loopback address.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};

/// The process's block of loopback addresses: `127.a.b.0/22` in 127.128.0.0/9, picked by the
/// process id. Its first three /24s are handed out by [`unique_loopback`], the last by
/// [`agent_loopback`].
fn block(sub: u32, host: u32) -> String {
    let pid = std::process::id();
    format!(
        "127.{}.{}.{}",
        128 | (pid & 0x7f),
        (((pid >> 7) & 0x3f) << 2) | sub,
        host
    )
}

/// A loopback address that no other test uses: the process id picks the block, a counter the
/// address. HAProxy binds with SO_REUSEPORT, so two tests that picked the same port on one
/// address would silently share a listener; distinct addresses cannot.
pub fn unique_loopback() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    assert!(
        n < 3 * 254,
        "more loopback addresses than a test process may use"
    );
    block(n / 254, n % 254 + 1)
}

/// How many agents one test process may start on addresses of their own.
pub const AGENT_ADDRESSES: u32 = 64;

/// A loopback address for one agent's API and probe listeners (fixed ports): the agent's test
/// certificate names every one of them ([`agent_loopback_sans`]), so TLS verification works
/// without picking and releasing ports.
pub fn agent_loopback() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    assert!(
        n < AGENT_ADDRESSES,
        "more agents than a test process may start"
    );
    block(3, n + 1)
}

/// `IP:…` subject alternative names for every address [`agent_loopback`] hands out.
pub fn agent_loopback_sans() -> String {
    (1..=AGENT_ADDRESSES)
        .map(|h| format!("IP:{}", block(3, h)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Children die with the test thread that started them (SIGKILL through the parent-death
/// signal), also when the test process is killed: a stopped run leaves no HAProxy, agent,
/// controller or API server behind.
pub trait Tied {
    fn tied(&mut self) -> &mut Self;
}

impl Tied for std::process::Command {
    fn tied(&mut self) -> &mut Self {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl and getppid are async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            self.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died before the signal was armed.
                if libc::getppid() == 1 {
                    return Err(std::io::Error::other("parent exited"));
                }
                Ok(())
            })
        }
    }
}

/// A TCP connection to `dest:port` from another loopback address `source` (another peer, as far
/// as per-address connection limits go).
pub fn connect_from(
    source: [u8; 4],
    dest: &str,
    port: u16,
) -> std::io::Result<std::net::TcpStream> {
    let dest: std::net::Ipv4Addr = dest.parse().expect("an IPv4 destination");
    use std::os::fd::FromRawFd;
    let addr = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns until it is wrapped.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = std::net::TcpStream::from_raw_fd(fd);
        let local = addr(source, 0);
        if libc::bind(fd, &local as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let remote = addr(dest.octets(), port);
        if libc::connect(fd, &remote as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}
