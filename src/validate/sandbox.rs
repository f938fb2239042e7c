//! A Landlock sandbox for `haproxy -c`.
//!
//! The controller runs `haproxy -c` on configurations that carry tenant text: with
//! `allow_config_snippets`, a snippet such as `acl x src -f /var/run/secrets/…/token` makes
//! HAProxy open that file and quote its first line in an alert, and the alert reaches status,
//! Events and webhook denials; a `lua-load`ed file runs at parse time. In the sandbox the check
//! can read only its own directory and what HAProxy itself needs to start (its binary, shared
//! libraries, name resolution, CA bundles), never the controller's credentials, the service
//! account token or another check's directory. It can write and create nothing, open no TCP
//! connection but to port 53 (DNS; Landlock ABI 4) and send no signal to a process outside the
//! sandbox, the controller included (ABI 6).
//!
//! Landlock needs no privilege and is enabled by most distributions' kernels since 5.13 (built
//! with `CONFIG_SECURITY_LANDLOCK` and listed in `lsm=`). Where it is missing, checks run
//! unsandboxed and the controller says so once, at warning level, and in the metric
//! `haptic_check_sandbox` (0); with `--check-sandbox required` they do not run at all.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

const CREATE_RULESET_VERSION: u32 = 1 << 0;
const RULE_PATH_BENEATH: libc::c_int = 1;
const RULE_NET_PORT: libc::c_int = 2;

const FS_EXECUTE: u64 = 1 << 0;
const FS_WRITE_FILE: u64 = 1 << 1;
const FS_READ_FILE: u64 = 1 << 2;
const FS_READ_DIR: u64 = 1 << 3;
/// Rights that apply to a file (not only to a directory) in every ABI.
const FS_FILE_RIGHTS: u64 = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE;

const NET_BIND_TCP: u64 = 1 << 0;
const NET_CONNECT_TCP: u64 = 1 << 1;

const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

#[repr(C)]
struct NetPortAttr {
    allowed_access: u64,
    port: u64,
}

/// How checks use the sandbox: `--check-sandbox` / `CHECK_SANDBOX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Sandboxed where the kernel has Landlock, unsandboxed (with a warning) elsewhere.
    Auto,
    /// No check runs without the sandbox.
    Required,
    /// No sandbox: for a developer's machine whose HAProxy loads libraries from elsewhere.
    Off,
}

impl Mode {
    pub fn parse(text: &str) -> Result<Mode, String> {
        match text {
            "" | "auto" => Ok(Mode::Auto),
            "required" => Ok(Mode::Required),
            "off" => Ok(Mode::Off),
            other => Err(format!("auto, required or off, not {other:?}")),
        }
    }
}

/// Set by `set_mode` (the controller's flag); otherwise read from `CHECK_SANDBOX` once.
static MODE: OnceLock<Mode> = OnceLock::new();
static REQUIRED: AtomicBool = AtomicBool::new(false);

/// Chooses the mode for every later check (before the first one).
pub fn set_mode(mode: Mode) {
    let _ = MODE.set(mode);
    REQUIRED.store(mode == Mode::Required, Ordering::Relaxed);
}

fn mode() -> Mode {
    *MODE.get_or_init(|| {
        let mode = std::env::var("CHECK_SANDBOX")
            .map(|v| {
                Mode::parse(&v).unwrap_or_else(|e| {
                    log::warn!("CHECK_SANDBOX: {e}; using auto");
                    Mode::Auto
                })
            })
            .unwrap_or(Mode::Auto);
        REQUIRED.store(mode == Mode::Required, Ordering::Relaxed);
        mode
    })
}

/// Every file-system right the kernel's Landlock ABI knows: all of them are denied unless a
/// rule allows them.
fn handled_fs(abi: i64) -> u64 {
    match abi {
        1 => (1 << 13) - 1,
        2 => (1 << 14) - 1,
        3 | 4 => (1 << 15) - 1,
        _ => (1 << 16) - 1,
    }
}

/// The kernel's Landlock ABI version, or `None` where Landlock is not available.
pub fn abi() -> Option<i64> {
    static ABI: OnceLock<Option<i64>> = OnceLock::new();
    *ABI.get_or_init(|| {
        // SAFETY: the documented version query: no attribute pointer, size 0.
        let v = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<RulesetAttr>(),
                0usize,
                CREATE_RULESET_VERSION,
            )
        };
        if v < 1 {
            let why = io::Error::last_os_error();
            if REQUIRED.load(Ordering::Relaxed) {
                log::error!(
                    "Landlock is not available in this kernel ({why}), and --check-sandbox is required: no configuration is checked, so none is deployed"
                );
            } else {
                log::warn!(
                    "Landlock is not available in this kernel ({why}): haproxy -c runs without its sandbox and can read every file the controller can"
                );
            }
            None
        } else {
            Some(v as i64)
        }
    })
}

/// The ABI checks are sandboxed with: `None` where the kernel has no Landlock or the mode is
/// `off` (the metric `haptic_check_sandbox`).
pub fn active_abi() -> Option<i64> {
    if mode() == Mode::Off {
        None
    } else {
        abi()
    }
}

const READ: u64 = FS_READ_FILE | FS_READ_DIR;

/// What HAProxy reads to start, wherever it checks: the paths present get a rule.
const SYSTEM: &[(&str, u64)] = &[
    // Programs and shared libraries (Debian's haproxy and its libraries, Lua modules, a static
    // haproxy in /usr/local/sbin).
    ("/usr", READ | FS_EXECUTE),
    ("/lib", READ | FS_EXECUTE),
    ("/lib64", READ | FS_EXECUTE),
    ("/lib32", READ | FS_EXECUTE),
    ("/bin", READ | FS_EXECUTE),
    ("/sbin", READ | FS_EXECUTE),
    // Of /etc, only what the loader, the resolver, time zones and TLS read: the controller's
    // own credentials and certificates are mounted under /etc/haptic.
    ("/etc/ld.so.cache", READ),
    ("/etc/ld.so.conf", READ),
    ("/etc/ld.so.conf.d", READ),
    ("/etc/localtime", READ),
    ("/etc/resolv.conf", READ),
    ("/etc/hosts", READ),
    ("/etc/host.conf", READ),
    ("/etc/nsswitch.conf", READ),
    ("/etc/gai.conf", READ),
    ("/etc/services", READ),
    ("/etc/protocols", READ),
    ("/etc/ssl", READ),
    ("/etc/pki", READ),
    ("/etc/ca-certificates", READ),
    ("/dev/null", FS_READ_FILE | FS_WRITE_FILE),
    ("/dev/urandom", FS_READ_FILE | FS_WRITE_FILE),
    ("/dev/random", FS_READ_FILE | FS_WRITE_FILE),
    // How many CPUs there are (HAProxy sizes its threads by them, as in the HAProxy pod).
    ("/sys/devices/system/cpu", READ),
    ("/sys/devices/system/node", READ),
    ("/proc/stat", READ),
    ("/proc/cpuinfo", READ),
];

/// What a `haproxy -c` of a configuration in `dir` may read: `dir` itself, the binary, and
/// the system paths HAProxy reads to start.
fn readable(dir: &Path, binary: Option<PathBuf>) -> Vec<(PathBuf, u64)> {
    let mut paths = vec![(dir.to_path_buf(), READ)];
    paths.extend(SYSTEM.iter().map(|(p, a)| (PathBuf::from(p), *a)));
    if let Some(binary) = binary {
        paths.push((binary, FS_READ_FILE | FS_EXECUTE));
    }
    paths
}

/// Adds a rule to `ruleset`.
///
/// # Safety
/// `attr` must be the attribute structure of `rule_type`.
unsafe fn add_rule<T>(
    ruleset: &OwnedFd,
    rule_type: libc::c_int,
    attr: &T,
    what: &str,
) -> io::Result<()> {
    // SAFETY: the caller passes the attribute of this rule type, valid for the call.
    let added = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            rule_type,
            attr as *const T,
            0u32,
        )
    };
    if added < 0 {
        return Err(io::Error::other(format!(
            "landlock rule for {what}: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// `name` as `Command` would find it: a path as given, a bare name on `PATH`.
fn resolve(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// A Landlock ruleset for one `haproxy -c` of a configuration in `dir`, ready for the child
/// to enter (`enter`). `None` where Landlock is not available.
pub fn ruleset_for_check(dir: &Path, haproxy_bin: &str) -> io::Result<Option<OwnedFd>> {
    if mode() == Mode::Off {
        return Ok(None);
    }
    let Some(abi) = abi() else {
        if REQUIRED.load(Ordering::Relaxed) {
            return Err(io::Error::other(
                "Landlock is not available in this kernel, and --check-sandbox is required",
            ));
        }
        return Ok(None);
    };
    let attr = RulesetAttr {
        handled_access_fs: handled_fs(abi),
        handled_access_net: if abi >= 4 {
            NET_BIND_TCP | NET_CONNECT_TCP
        } else {
            0
        },
        scoped: if abi >= 6 {
            SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        } else {
            0
        },
    };
    // Older kernels refuse a larger attribute than they know: give them the part they read.
    let size = if abi >= 6 {
        std::mem::size_of::<RulesetAttr>()
    } else if abi >= 4 {
        16
    } else {
        8
    };
    // SAFETY: `attr` is a valid ruleset attribute of at least `size` bytes.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            size,
            0u32,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    let ruleset = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    for (path, access) in readable(dir, resolve(haproxy_bin)) {
        let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
            continue;
        };
        // SAFETY: a NUL-terminated path; O_PATH opens it only as a reference.
        let raw = unsafe { libc::open(c_path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if raw < 0 {
            continue; // not on this system (a scratch image has no /usr/lib)
        }
        // SAFETY: `open` returned a new descriptor.
        let parent = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(raw) });
        // What was opened (fstat), not what the path names by now.
        let is_dir = parent.metadata().map(|m| m.is_dir()).unwrap_or(false);
        let allowed = if is_dir {
            access
        } else {
            access & FS_FILE_RIGHTS
        };
        let rule = PathBeneathAttr {
            allowed_access: allowed & handled_fs(abi),
            parent_fd: parent.as_raw_fd(),
        };
        // SAFETY: a path-beneath attribute for a path-beneath rule.
        unsafe {
            add_rule(
                &ruleset,
                RULE_PATH_BENEATH,
                &rule,
                &path.display().to_string(),
            )?
        };
    }
    if abi >= 4 {
        // DNS over TCP, which the resolver falls back to for long answers (a headless Service
        // with many addresses named in a `server` line): port 53 only.
        let rule = NetPortAttr {
            allowed_access: NET_CONNECT_TCP,
            port: 53,
        };
        // SAFETY: a net-port attribute for a net-port rule.
        unsafe { add_rule(&ruleset, RULE_NET_PORT, &rule, "DNS over TCP")? };
    }
    Ok(Some(ruleset))
}

/// Restricts the calling thread to the ruleset, and every process it starts from now on; the
/// process's other threads stay as they were (no `LANDLOCK_RESTRICT_SELF_TSYNC`), and a thread
/// cannot leave its restrictions, so call it on a thread of its own.
pub fn enter(ruleset: RawFd) -> io::Result<()> {
    // SAFETY: plain system calls on integers.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Mode;

    #[test]
    fn the_mode_is_one_of_three_words() {
        assert_eq!(Mode::parse(""), Ok(Mode::Auto));
        assert_eq!(Mode::parse("auto"), Ok(Mode::Auto));
        assert_eq!(Mode::parse("required"), Ok(Mode::Required));
        assert_eq!(Mode::parse("off"), Ok(Mode::Off));
        assert!(Mode::parse("Required").is_err());
        assert!(Mode::parse("no").is_err());
    }
}
