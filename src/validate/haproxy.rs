//! `haproxy -c` on a bundle, in a private temporary directory.
//!
//! Auxiliary files are referenced relative to haproxy.cfg (`default-path config`), so writing the
//! bundle as-is into a fresh directory checks exactly what the agent will write. The check runs
//! in a Landlock sandbox (`sandbox`): it reads its own directory and what HAProxy needs to
//! start, nothing else of the controller's.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use haptic_agent::protocol::Bundle;

/// How long one check may take before it is abandoned.
const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckError {
    /// HAProxy rejected the configuration; `message` holds its own alerts.
    Rejected { message: String },
    /// The check could not run (binary missing, temp dir, timeout).
    CouldNotRun(String),
}

impl std::fmt::Display for CheckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckError::Rejected { message } => {
                write!(f, "haproxy rejected the configuration:\n{message}")
            }
            CheckError::CouldNotRun(why) => write!(f, "could not run haproxy -c: {why}"),
        }
    }
}

impl std::error::Error for CheckError {}

/// A directory under the system temp dir, private to this process, removed on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> std::io::Result<TempDir> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}-{nanos:x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::DirBuilder::new().mode_private().create(&path)?;
        Ok(TempDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

trait PrivateDir {
    fn mode_private(&mut self) -> &mut Self;
}

impl PrivateDir for std::fs::DirBuilder {
    fn mode_private(&mut self) -> &mut Self {
        use std::os::unix::fs::DirBuilderExt;
        self.mode(0o700)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Writes haproxy.cfg and every file of the bundle under `dir`, refusing paths that would
/// escape it.
pub fn write_bundle(bundle: &Bundle, dir: &Path) -> std::io::Result<()> {
    std::fs::write(dir.join("haproxy.cfg"), bundle.haproxy_cfg.as_bytes())?;
    for file in &bundle.files {
        let relative = Path::new(&file.path);
        let safe = relative
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !safe {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("unsafe file path {:?}", file.path),
            ));
        }
        let target = dir.join(relative);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(target, &file.content)?;
    }
    Ok(())
}

/// Runs `haproxy -c` on the bundle. `Ok` carries HAProxy's warnings (possibly empty).
pub fn check_bundle(haproxy_bin: &str, bundle: &Bundle) -> Result<String, CheckError> {
    let dir = TempDir::new("haptic-check")
        .map_err(|e| CheckError::CouldNotRun(format!("create temp dir: {e}")))?;
    write_bundle(bundle, dir.path())
        .map_err(|e| CheckError::CouldNotRun(format!("write bundle: {e}")))?;
    check_file(haproxy_bin, &dir.path().join("haproxy.cfg"))
}

/// Runs `haproxy -c -f cfg`, with messages shortened to paths relative to the config dir, in
/// a sandbox that lets it read that directory and what HAProxy needs to start.
pub fn check_file(haproxy_bin: &str, cfg: &Path) -> Result<String, CheckError> {
    check_file_in(haproxy_bin, cfg, true)
}

fn check_file_in(haproxy_bin: &str, cfg: &Path, sandboxed: bool) -> Result<String, CheckError> {
    let dir = cfg.parent().unwrap_or(Path::new("."));
    let ruleset = if sandboxed {
        super::sandbox::ruleset_for_check(dir, haproxy_bin)
            .map_err(|e| CheckError::CouldNotRun(format!("sandbox: {e}")))?
    } else {
        None
    };
    let mut command = Command::new(haproxy_bin);
    command
        .arg("-c")
        .arg("-f")
        .arg(cfg)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let spawned = match &ruleset {
        // A thread of its own enters the sandbox and starts haproxy: the child inherits the
        // thread's restrictions and the rest of the controller keeps none. Entering it in the
        // child instead (`pre_exec`) would make std fork the whole controller for every check
        // rather than spawn (8 ms at 95 MiB resident, growing with the process).
        Some(ruleset) => {
            use std::os::fd::AsRawFd;
            let fd = ruleset.as_raw_fd();
            std::thread::scope(|scope| {
                std::thread::Builder::new()
                    .name("haproxy-check".into())
                    .spawn_scoped(scope, || {
                        super::sandbox::enter(fd)?;
                        command.spawn()
                    })?
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("the sandbox thread panicked")))
            })
        }
        None => command.spawn(),
    };
    let ruleset_used = ruleset.is_some();
    drop(ruleset);
    let mut child =
        spawned.map_err(|e| CheckError::CouldNotRun(format!("start {haproxy_bin}: {e}")))?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    // Read both pipes on threads so a chatty haproxy cannot block on a full pipe. A thread
    // that cannot start (the process's limit) fails this check, not the controller.
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::Builder::new()
            .name("haproxy-check-output".into())
            .spawn(move || {
                let mut text = String::new();
                if let Some(mut p) = pipe {
                    let _ = p.read_to_string(&mut text);
                }
                text
            })
    };
    let readers = (
        read(stdout.map(|p| Box::new(p) as Box<dyn Read + Send>)),
        read(stderr.map(|p| Box::new(p) as Box<dyn Read + Send>)),
    );
    let (out, err) = match readers {
        (Ok(out), Ok(err)) => (out, err),
        (out, err) => {
            let _ = child.kill();
            let _ = child.wait();
            let why = [out.err(), err.err()].into_iter().flatten().next();
            return Err(CheckError::CouldNotRun(format!(
                "start a thread to read haproxy's output: {}",
                why.map(|e| e.to_string()).unwrap_or_default()
            )));
        }
    };
    let deadline = Instant::now() + CHECK_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CheckError::CouldNotRun(format!(
                    "timed out after {}s",
                    CHECK_TIMEOUT.as_secs()
                )));
            }
            Err(e) => return Err(CheckError::CouldNotRun(format!("wait for haproxy: {e}"))),
        }
    };
    let output = format!(
        "{}{}",
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default()
    );
    let prefix = format!("{}/", dir.display());
    let output = output.replace(&prefix, "");
    let relevant: Vec<&str> = output
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("Configuration file is valid"))
        .collect();
    if status.success() {
        Ok(relevant.join("\n"))
    } else if ruleset_used && output.contains("error while loading shared libraries") {
        // HAProxy's libraries live outside what the sandbox lets it read.
        Err(CheckError::CouldNotRun(format!(
            "{}\n(haproxy -c runs in a Landlock sandbox that reads /usr and /lib*; where HAProxy \
             loads libraries from elsewhere, set CHECK_SANDBOX=off)",
            relevant.join("\n")
        )))
    } else {
        let alerts: Vec<&str> = relevant
            .iter()
            .copied()
            .filter(|l| l.contains("ALERT"))
            .collect();
        let message = if alerts.is_empty() {
            relevant.join("\n")
        } else {
            alerts.join("\n")
        };
        Err(CheckError::Rejected { message })
    }
}

/// `haproxy -v` → the release as HAProxy names it (e.g. `2.6.12-1+deb12u4`), the same string
/// the master's `show proc` reports for the running version.
pub fn haproxy_release(haproxy_bin: &str) -> Result<String, String> {
    let out = Command::new(haproxy_bin)
        .arg("-v")
        .output()
        .map_err(|e| format!("run {haproxy_bin} -v: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "version")
        .nth(1)
        .map(str::to_string)
        .ok_or_else(|| format!("no version in {haproxy_bin} -v output: {text:?}"))
}

/// A release (`haproxy_release`) → `major.minor` (e.g. `2.6`).
pub fn major_minor(release: &str) -> Result<String, String> {
    let mut parts = release.split('.');
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => Ok(format!(
            "{major}.{}",
            minor.trim_end_matches(|c: char| !c.is_ascii_digit())
        )),
        _ => Err(format!("unexpected haproxy version {release:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_agent::protocol::{BundleFile, FileKind};

    /// The kernel's Landlock ABI; the tests below say so when there is none.
    fn landlock() -> Option<i64> {
        let abi = crate::validate::sandbox::abi();
        if abi.is_none() {
            eprintln!("SKIPPED: this kernel has no Landlock, haproxy -c runs without its sandbox");
        }
        abi
    }

    const HEAD: &str = "global\n  log stdout format raw local0\ndefaults\n  mode http\n  timeout client 1s\n  timeout server 1s\n  timeout connect 1s\n";

    fn bundle(cfg: String, files: Vec<(&str, &str)>) -> Bundle {
        Bundle::new(
            cfg,
            files
                .into_iter()
                .map(|(path, content)| BundleFile {
                    kind: FileKind::General,
                    path: path.to_string(),
                    content: content.as_bytes().to_vec(),
                })
                .collect(),
        )
    }

    /// `check_bundle`, with or without the sandbox.
    fn check(bundle: &Bundle, sandboxed: bool) -> Result<String, CheckError> {
        let dir = TempDir::new("haptic-check").expect("dir");
        write_bundle(bundle, dir.path()).expect("write");
        check_file_in("haproxy", &dir.path().join("haproxy.cfg"), sandboxed)
    }

    #[test]
    fn a_check_reads_its_own_files_and_no_file_of_the_controller() {
        if landlock().is_none() {
            return;
        }
        // A file the controller can read, outside the check's directory: as the service
        // account token or a mounted credential is.
        let private = TempDir::new("haptic-test-private").expect("dir");
        let secret = private.path().join("token");
        std::fs::write(&secret, "secret-token-abc.def\n").expect("write");
        let acl = |source: &str| {
            format!(
                "{HEAD}frontend f\n  bind 127.0.0.1:8080\n  acl allowed src -f {source}\n  http-request deny unless allowed\n"
            )
        };
        // The check's own files are read: a valid list passes, an invalid one is quoted.
        let own = check_bundle(
            "haproxy",
            &bundle(acl("nets.lst"), vec![("nets.lst", "10.0.0.0/8\n")]),
        );
        assert!(own.is_ok(), "{own:?}");
        let own = check_bundle(
            "haproxy",
            &bundle(acl("nets.lst"), vec![("nets.lst", "not-a-net\n")]),
        );
        assert!(
            matches!(&own, Err(CheckError::Rejected { message }) if message.contains("not-a-net")),
            "{own:?}"
        );
        // A file outside it: without the sandbox HAProxy quotes its first line; in it, the
        // check fails without quoting it.
        let outside = bundle(acl(&secret.display().to_string()), vec![]);
        let open = check(&outside, false);
        assert!(format!("{open:?}").contains("secret-token"), "{open:?}");
        let Err(CheckError::Rejected { message }) = check(&outside, true) else {
            panic!("the check read a file outside its directory");
        };
        assert!(!message.contains("secret-token"), "{message}");
        assert!(
            message.contains("token"),
            "HAProxy names the file it could not open: {message}"
        );
        // The sandbox was the check's: this thread and new ones read the file as before.
        assert!(std::fs::read_to_string(&secret).is_ok_and(|t| t.contains("secret-token")));
        let path = secret.clone();
        let other = std::thread::spawn(move || std::fs::read_to_string(path).is_ok());
        assert!(
            other.join().unwrap(),
            "a thread started after the check is sandboxed"
        );
    }

    /// What a `lua-load`ed file managed outside the check: read a file, write one, kill a
    /// process of the same user, connect to a TCP service on loopback.
    fn lua_escapes(sandboxed: bool) -> Vec<&'static str> {
        let private = TempDir::new("haptic-test-private").expect("dir");
        let secret = private.path().join("token");
        std::fs::write(&secret, "secret-token-abc.def\n").expect("write");
        let marker = private.path().join("marker");
        // A process of the controller's user outside the sandbox (as the controller is).
        let mut victim = Command::new("sleep").arg("30").spawn().expect("sleep");
        // A TCP service it could reach (the API server, a metadata endpoint).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let lua = format!(
            "local f = io.open({secret:?}, 'r')\n\
             if f then print('read: ' .. f:read('*l')) end\n\
             local w = io.open({marker:?}, 'w')\n\
             if w then w:write('written') w:close() end\n\
             os.execute('kill -9 {pid}')\n\
             os.execute([[bash -c 'echo hello > /dev/tcp/127.0.0.1/{port}']])\n\
             print('lua ran')\n",
            secret = secret.display().to_string(),
            marker = marker.display().to_string(),
            pid = victim.id(),
        );
        let cfg = HEAD.replacen("global\n", "global\n  lua-load probe.lua\n", 1);
        let result = check(&bundle(cfg, vec![("probe.lua", &lua)]), sandboxed);
        // A signal is delivered after kill() returns: give it time to land.
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut killed = false;
        while Instant::now() < deadline {
            if victim.try_wait().expect("wait").is_some() {
                killed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = victim.kill();
        let _ = victim.wait();
        let text = format!("{result:?}");
        assert!(text.contains("lua ran"), "the Lua file did not run: {text}");
        let mut escaped = Vec::new();
        if text.contains("secret-token") {
            escaped.push("read a file");
        }
        if marker.exists() {
            escaped.push("wrote a file");
        }
        if killed {
            escaped.push("killed a process");
        }
        if listener.accept().is_ok() {
            escaped.push("connected to a TCP service");
        }
        escaped
    }

    #[test]
    fn lua_in_a_check_can_neither_read_write_signal_nor_connect_outside_it() {
        let Some(abi) = landlock() else {
            return;
        };
        // Without the sandbox every probe works (so the probes prove something).
        assert_eq!(
            lua_escapes(false),
            [
                "read a file",
                "wrote a file",
                "killed a process",
                "connected to a TCP service"
            ]
        );
        // In it, none that this kernel's Landlock covers: files always, TCP from ABI 4
        // (Linux 6.7), signals from ABI 6 (Linux 6.12).
        let escaped: Vec<&str> = lua_escapes(true)
            .into_iter()
            .filter(|e| match *e {
                "connected to a TCP service" => abi >= 4,
                "killed a process" => abi >= 6,
                _ => true,
            })
            .collect();
        assert!(escaped.is_empty(), "Lua in the sandbox {escaped:?}");
    }
}
