//! Talking to HAProxy: the master socket (`show proc`, `reload`), runtime commands (on the
//! worker's stats socket when given, otherwise through the master with `@1`), and `haproxy -c`.
//!
//! Every call opens a fresh connection, sends one command (with its payload) and reads until
//! HAProxy closes: the CLI's non-interactive mode. No state is kept between calls, so a master
//! that re-executes itself during a reload only costs a retried connect.

use std::fmt;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long callers keep retrying a master socket that refuses connections (it does while the
/// master re-executes itself) before reporting HAProxy unreachable.
pub const SOCKET_PATIENCE: Duration = Duration::from_secs(2);

/// A failed conversation with HAProxy, with the command it was about.
#[derive(Debug)]
pub struct HaproxyError {
    pub what: String,
    pub detail: String,
}

impl fmt::Display for HaproxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.detail)
    }
}

impl std::error::Error for HaproxyError {}

fn err(what: impl Into<String>, detail: impl fmt::Display) -> HaproxyError {
    HaproxyError {
        what: what.into(),
        detail: detail.to_string(),
    }
}

/// How to reach HAProxy and which binary checks configurations.
#[derive(Debug, Clone)]
pub struct Haproxy {
    pub master_socket: PathBuf,
    pub worker_socket: Option<PathBuf>,
    pub binary: PathBuf,
    /// Read timeout of one command; reloads on 2.7+ wait for the new worker up to `reload_timeout`.
    pub command_timeout: Duration,
    pub reload_timeout: Duration,
}

/// The parsed `show proc` of the master.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcInfo {
    pub master_pid: u32,
    pub reloads: u64,
    pub failed: u64,
    pub version: String,
    /// Current workers as (pid, reloads survived); old (draining) workers are not listed.
    pub workers: Vec<(u32, u64)>,
    /// Old workers as (pid, reloads survived).
    pub old_workers: Vec<(u32, u64)>,
}

impl ProcInfo {
    /// The worker that serves: the newest current one (the one that has survived the fewest
    /// reloads). HAProxy 3.1 and later list no current worker after a failed reload: the
    /// worker from before it is then the newest *old* worker, and it still serves (2.6 keeps it
    /// under `# workers`). Older old workers only finish their connections.
    pub fn worker_pid(&self) -> Option<u32> {
        let newest = |list: &[(u32, u64)]| {
            list.iter()
                .min_by_key(|(_, reloads)| *reloads)
                .map(|(pid, _)| *pid)
        };
        newest(&self.workers).or_else(|| newest(&self.old_workers))
    }

    pub fn parse(text: &str) -> Result<ProcInfo, String> {
        let mut info = ProcInfo::default();
        let mut section = "master";
        let mut saw_master = false;
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with("#<PID>") || line.is_empty() {
                continue;
            }
            if let Some(name) = line.strip_prefix('#') {
                section = match name.trim() {
                    "workers" => "workers",
                    "old workers" => "old",
                    _ => "other",
                };
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let pid: Option<u32> = words.first().and_then(|w| w.parse().ok());
            match (section, pid, words.get(1)) {
                ("master", Some(pid), Some(&"master")) => {
                    saw_master = true;
                    info.master_pid = pid;
                    info.reloads = words.get(2).and_then(|w| w.parse().ok()).unwrap_or(0);
                    if let Some(i) = words.iter().position(|w| *w == "[failed:") {
                        info.failed = words
                            .get(i + 1)
                            .map(|w| w.trim_end_matches(']'))
                            .and_then(|w| w.parse().ok())
                            .unwrap_or(0);
                    }
                    info.version = words.last().map(|s| s.to_string()).unwrap_or_default();
                }
                ("workers", Some(pid), Some(&"worker")) => {
                    info.workers
                        .push((pid, words.get(2).and_then(|w| w.parse().ok()).unwrap_or(0)));
                }
                ("old", Some(pid), _) => info
                    .old_workers
                    .push((pid, words.get(2).and_then(|w| w.parse().ok()).unwrap_or(0))),
                _ => {}
            }
        }
        if saw_master {
            Ok(info)
        } else {
            Err(format!(
                "no master line in show proc output: {:?}",
                text.chars().take(200).collect::<String>()
            ))
        }
    }
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadOutcome {
    pub worker_pid_before: Option<u32>,
    pub worker_pid_after: Option<u32>,
    pub duration: Duration,
}

/// A reload that did not succeed.
#[derive(Debug)]
pub struct ReloadError {
    pub error: HaproxyError,
    /// HAProxy refused the configuration: the previous worker serves, loaded from the previous
    /// files. Otherwise HAProxy may be reading the files on disk (a reload of its own or of
    /// someone else's is loading, or the master does not answer), and they must stay.
    pub refused: bool,
    /// HAProxy as it was when it was asked to reload, when it may have been: it may still
    /// load the files on disk and start a worker from them.
    pub asked: Option<Box<ProcInfo>>,
}

impl fmt::Display for ReloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

/// HAProxy 3.1 and later refuse a reload while the worker of the last one is still loading.
const RELOAD_IN_PROGRESS: &str = "Another reload is still in progress";

impl Haproxy {
    /// Sends `input` (a command line, optionally followed by a payload) and returns everything
    /// HAProxy answers until it closes the connection.
    fn converse(
        &self,
        socket: &Path,
        input: &str,
        timeout: Duration,
    ) -> Result<String, HaproxyError> {
        let stream = connect(socket, input)?;
        exchange(stream, socket, input, timeout)
    }

    /// A command for the master process itself (`show proc`, `reload`).
    pub fn master(&self, command: &str) -> Result<String, HaproxyError> {
        self.converse(
            &self.master_socket,
            &format!("{command}\n"),
            self.command_timeout,
        )
    }

    /// A runtime command for the current worker. `payload`, when given, is sent after `<<` and
    /// must not contain blank lines (a blank line ends it).
    pub fn runtime(&self, command: &str, payload: Option<&str>) -> Result<String, HaproxyError> {
        let mut input = match &self.worker_socket {
            Some(_) => command.to_string(),
            None => format!("@1 {command}"),
        };
        if let Some(p) = payload {
            input.push_str(" <<\n");
            input.push_str(p.trim_end_matches('\n'));
            input.push_str("\n\n");
        } else {
            input.push('\n');
        }
        let socket = self.worker_socket.as_deref().unwrap_or(&self.master_socket);
        self.converse(socket, &input, self.command_timeout)
    }

    /// `show proc`, retried while the master socket refuses connections (it does so briefly while
    /// the master re-executes itself during a reload).
    pub fn show_proc(&self, patience: Duration) -> Result<ProcInfo, HaproxyError> {
        let deadline = Instant::now() + patience;
        loop {
            let attempt = self
                .master("show proc")
                .and_then(|text| ProcInfo::parse(&text).map_err(|e| err("show proc", e)));
            match attempt {
                Ok(info) => return Ok(info),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Sends `reload` to the master and waits for the outcome: on 2.7+ the `Success=` reply, on
    /// 2.6 (which answers nothing) the `show proc` counters and a new worker pid.
    pub fn reload(&self) -> Result<ReloadOutcome, ReloadError> {
        let started = Instant::now();
        let unknown = |error| ReloadError {
            error,
            refused: false,
            asked: None,
        };
        let before = self.show_proc(SOCKET_PATIENCE).map_err(unknown)?;
        let refused = |error| ReloadError {
            error,
            refused: true,
            asked: None,
        };
        let unconfirmed = |error| ReloadError {
            error,
            refused: false,
            asked: Some(Box::new(before.clone())),
        };
        // Not connected: the master was never asked (it refuses connections while it reads a
        // configuration, on 2.6). From the first byte written on, it may have been.
        let stream = connect(&self.master_socket, "reload").map_err(unknown)?;
        let reply = exchange(stream, &self.master_socket, "reload\n", self.reload_timeout)
            .map_err(unconfirmed)?;
        if reply.contains("Success=0") {
            let error = err(
                "reload",
                format!("HAProxy refused the new configuration: {}", reply.trim()),
            );
            return Err(match reply.contains(RELOAD_IN_PROGRESS) {
                true => unknown(err("reload", RELOAD_IN_PROGRESS)),
                false => refused(error),
            });
        }
        let deadline = started + self.reload_timeout;
        loop {
            let now = self
                .show_proc(deadline.saturating_duration_since(Instant::now()))
                .map_err(unconfirmed)?;
            if now.reloads > before.reloads || reply.contains("Success=1") {
                if now.failed > 0 && !reply.contains("Success=1") {
                    return Err(refused(err(
                        "reload",
                        format!("the master reports a failed reload (failed: {}); the previous worker keeps serving", now.failed),
                    )));
                }
                let after = now.worker_pid();
                if after.is_some() && after != before.worker_pid() {
                    return Ok(ReloadOutcome {
                        worker_pid_before: before.worker_pid(),
                        worker_pid_after: after,
                        duration: started.elapsed(),
                    });
                }
            }
            if Instant::now() >= deadline {
                return Err(unconfirmed(err(
                    "reload",
                    format!("no new worker within {:?}", self.reload_timeout),
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the worker the runtime API reaches is `pid`: a worker HAProxy 3.1 and later
    /// list while it still reads its configuration does not answer yet (the previous one does).
    pub fn worker_answers(&self, pid: u32) -> bool {
        let expected = format!("Pid: {pid}");
        self.runtime("show info", None)
            .is_ok_and(|info| info.lines().any(|l| l.trim() == expected))
    }

    /// Runs `haproxy -c -f <config>` in `dir` (so relative paths resolve as they will at run
    /// time). `Ok(output)` when valid, `Err(output)` when HAProxy rejects it.
    pub fn check(&self, dir: &Path, config: &Path, log: &Path) -> Result<String, HaproxyError> {
        let out =
            std::fs::File::create(log).map_err(|e| err(format!("create {}", log.display()), e))?;
        let out2 = out.try_clone().map_err(|e| err("dup log", e))?;
        let mut child = Command::new(&self.binary)
            .arg("-c")
            .arg("-f")
            .arg(config)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(out2)
            .spawn()
            .map_err(|e| err(format!("run {}", self.binary.display()), e))?;
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(err("haproxy -c", "timed out after 120 s"));
                }
                Err(e) => return Err(err("haproxy -c", e)),
            }
        };
        let output = std::fs::read_to_string(log).unwrap_or_default();
        if status.success() {
            Ok(output)
        } else {
            Err(err("haproxy -c", output.trim().to_string()))
        }
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

fn connect(socket: &Path, input: &str) -> Result<UnixStream, HaproxyError> {
    UnixStream::connect(socket).map_err(|e| {
        err(
            format!("{} on {}", first_line(input), socket.display()),
            format!("connect: {e}"),
        )
    })
}

/// Writes `input` on a connected socket, closes the writing side (the command, and payload, is
/// complete: HAProxy answers and then closes its side) and reads the answer.
fn exchange(
    mut stream: UnixStream,
    socket: &Path,
    input: &str,
    timeout: Duration,
) -> Result<String, HaproxyError> {
    let what = || format!("{} on {}", first_line(input), socket.display());
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| err(what(), e))?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(|e| err(what(), e))?;
    stream
        .write_all(input.as_bytes())
        .map_err(|e| err(what(), format!("write: {e}")))?;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut reply = Vec::new();
    stream
        .read_to_end(&mut reply)
        .map_err(|e| err(what(), format!("read: {e}")))?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_show_proc_of_2_6_after_a_failed_reload() {
        let text =
            "#<PID>          <type>          <reloads>       <uptime>        <version>      \n\
            5192            master          2 [failed: 1]   0d00h00m04s     2.6.12-1+deb12u4\n\
            # workers\n\
            5367            worker          1               0d00h00m01s     2.6.12-1+deb12u4\n\
            # old workers\n\
            5193            worker          2               0d00h00m05s     2.6.12-1+deb12u4\n\
            # programs\n\n";
        let info = ProcInfo::parse(text).unwrap();
        assert_eq!((info.master_pid, info.reloads, info.failed), (5192, 2, 1));
        assert_eq!(info.worker_pid(), Some(5367));
        assert_eq!(info.old_workers, [(5193, 2)]);
        assert_eq!(info.version, "2.6.12-1+deb12u4");
        assert!(ProcInfo::parse("Unknown command.\n").is_err());
    }

    #[test]
    fn parses_show_proc_of_3_2_after_a_failed_reload() {
        // As HAProxy 3.2.26 prints it: the worker from before the failed reload is listed as
        // old, and it is the one that serves; 16001 drains from an earlier reload.
        let text =
            "#<PID>          <type>          <reloads>       <uptime>        <version>      \n\
            16064           master          3 [failed: 1]   0d00h00m02s     3.2.26-1       \n\
            # workers\n\
            # old workers\n\
            16001           worker          3               0d00h00m09s     3.2.26-1       \n\
            16067           worker          1               0d00h00m02s     3.2.26-1       \n\n";
        let info = ProcInfo::parse(text).unwrap();
        assert_eq!((info.master_pid, info.reloads, info.failed), (16064, 3, 1));
        assert!(info.workers.is_empty());
        assert_eq!(info.worker_pid(), Some(16067));
        assert_eq!(info.version, "3.2.26-1");
        // A current worker always wins over old ones.
        let reloaded = text.replace(
            "# workers\n",
            "# workers\n16070           worker          0               0d00h00m00s     3.2.26-1\n",
        );
        assert_eq!(
            ProcInfo::parse(&reloaded).unwrap().worker_pid(),
            Some(16070)
        );
    }
}
