//! Executes the classifier's runtime actions against HAProxy and checks every reply.
//!
//! HAProxy's CLI answers errors in prose on an otherwise successful connection, so each command
//! has its own notion of success. Maps are replaced atomically (`prepare`/`add`/`commit` on a new
//! version), payloads are split under `tune.bufsize`, and a failed certificate or map transaction
//! is aborted so the next attempt starts clean.

use crate::classify::RuntimeAction;
use crate::haproxy::Haproxy;
use crate::protocol::Bundle;

/// Largest map payload per `add map` command; HAProxy's default `tune.bufsize` is 16 kB and the
/// command line itself shares the buffer.
const MAP_CHUNK_BYTES: usize = 12_000;

/// A runtime command HAProxy refused (or a transport error), with what was sent before it.
#[derive(Debug)]
pub struct RuntimeFailure {
    pub sent: Vec<String>,
    pub error: String,
}

/// Runs `actions` in order; payloads come from `bundle`. Returns the commands sent.
pub fn execute(
    haproxy: &Haproxy,
    actions: &[RuntimeAction],
    bundle: &Bundle,
) -> Result<Vec<String>, RuntimeFailure> {
    let mut run = Run {
        haproxy,
        sent: Vec::new(),
    };
    for action in actions {
        if let Err(error) = run.action(action, bundle) {
            return Err(RuntimeFailure {
                sent: run.sent,
                error,
            });
        }
    }
    Ok(run.sent)
}

struct Run<'a> {
    haproxy: &'a Haproxy,
    sent: Vec<String>,
}

impl Run<'_> {
    /// Sends one command and checks the reply with `ok`; `shown` is what gets recorded.
    fn send(
        &mut self,
        command: &str,
        payload: Option<&str>,
        shown: String,
        ok: impl Fn(&str) -> bool,
    ) -> Result<String, String> {
        self.sent.push(shown);
        let reply = self
            .haproxy
            .runtime(command, payload)
            .map_err(|e| e.to_string())?;
        if ok(reply.trim()) {
            Ok(reply)
        } else {
            Err(format!("{command}: HAProxy answered {:?}", reply.trim()))
        }
    }

    fn action(&mut self, action: &RuntimeAction, bundle: &Bundle) -> Result<(), String> {
        match action {
            RuntimeAction::Command(cmd) => {
                self.send(cmd, None, cmd.clone(), |r| {
                    r.is_empty() || r.contains("changed from") || r.contains("no need to change")
                })?;
                Ok(())
            }
            RuntimeAction::ReplaceMap { name, path, .. } => {
                self.replace_map(name, content(bundle, path)?)
            }
            RuntimeAction::SetCert {
                name,
                path,
                new_store,
            } => self.set_cert(name, content(bundle, path)?, *new_store),
            RuntimeAction::AddCrtListLine { crt_list, line } => {
                let cmd = format!("add ssl crt-list {crt_list}");
                self.send(&cmd, Some(line), format!("{cmd} <<({line})"), |r| {
                    r.contains("Success!")
                })?;
                Ok(())
            }
            RuntimeAction::DelCrtListEntry { crt_list, cert } => {
                let cmd = format!("del ssl crt-list {crt_list} {cert}");
                self.send(&cmd, None, cmd.clone(), crt_list_entry_deleted)?;
                Ok(())
            }
            RuntimeAction::DelCert { name } => {
                let cmd = format!("del ssl cert {name}");
                self.send(&cmd, None, cmd.clone(), cert_deleted)?;
                Ok(())
            }
        }
    }

    fn replace_map(&mut self, name: &str, content: &str) -> Result<(), String> {
        let prepare = format!("prepare map {name}");
        let reply = self.send(&prepare, None, prepare.clone(), |r| {
            r.starts_with("New version created:")
        })?;
        let version: u64 = reply
            .trim()
            .strip_prefix("New version created:")
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("{prepare}: unexpected reply {:?}", reply.trim()))?;
        let result = self.fill_and_commit_map(name, version, content);
        if result.is_err() {
            // Drop the half-filled version so it cannot be committed by accident later.
            let _ = self
                .haproxy
                .runtime(&format!("clear map @{version} {name}"), None);
        }
        result
    }

    fn fill_and_commit_map(
        &mut self,
        name: &str,
        version: u64,
        content: &str,
    ) -> Result<(), String> {
        let entries = map_entries(content);
        let count = entries.len();
        for chunk in chunks(&entries, MAP_CHUNK_BYTES) {
            let cmd = format!("add map @{version} {name}");
            let shown = format!("{cmd} <<({} entries)", chunk.lines().count());
            self.send(&cmd, Some(&chunk), shown, str::is_empty)?;
        }
        let commit = format!("commit map @{version} {name}");
        self.send(
            &commit,
            None,
            format!("{commit} ({count} entries)"),
            str::is_empty,
        )?;
        Ok(())
    }

    fn set_cert(&mut self, name: &str, content: &str, new_store: bool) -> Result<(), String> {
        if new_store {
            let cmd = format!("new ssl cert {name}");
            self.send(&cmd, None, cmd.clone(), |r| {
                r.contains("New empty certificate store")
            })?;
        }
        let pem: String = content
            .lines()
            .map(|l| l.trim_end_matches('\r'))
            .filter(|l| !l.trim().is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        let set = format!("set ssl cert {name}");
        let result = self
            .send(
                &set,
                Some(&pem),
                format!("{set} <<({} bytes)", pem.len()),
                |r| r.contains("Transaction created") || r.contains("Transaction updated"),
            )
            .and_then(|_| {
                let commit = format!("commit ssl cert {name}");
                self.send(&commit, None, commit.clone(), |r| r.contains("Success!"))
            });
        if result.is_err() {
            let _ = self
                .haproxy
                .runtime(&format!("abort ssl cert {name}"), None);
        }
        result.map(|_| ())
    }
}

fn content<'b>(bundle: &'b Bundle, path: &str) -> Result<&'b str, String> {
    let file = bundle
        .files
        .iter()
        .find(|f| f.path == path)
        .ok_or_else(|| format!("bundle has no file {path}"))?;
    std::str::from_utf8(&file.content).map_err(|_| format!("file {path} is not UTF-8 text"))
}

/// The lines HAProxy itself would load from a map file: comments and blank lines dropped (in a
/// payload a blank line would end it and a `#` line would become a key).
fn map_entries(content: &str) -> Vec<&str> {
    content
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// Joins lines into newline-separated payloads of at most `limit` bytes (a longer single line
/// gets a chunk of its own and HAProxy decides).
fn chunks(lines: &[&str], limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in lines {
        if !current.is_empty() && current.len() + line.len() + 1 > limit {
            out.push(std::mem::take(&mut current));
        }
        current.push_str(line);
        current.push('\n');
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_payload_drops_comments_and_chunks_under_limit() {
        let entries = map_entries("# header\n\na.example be1\n  b.example be2  \n");
        assert_eq!(entries, ["a.example be1", "b.example be2"]);
        let many: Vec<String> = (0..2000)
            .map(|i| format!("host{i}.example backend_{i}"))
            .collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let parts = chunks(&refs, MAP_CHUNK_BYTES);
        assert!(parts.len() > 1);
        assert!(parts.iter().all(|p| p.len() <= MAP_CHUNK_BYTES));
        assert_eq!(parts.concat().lines().count(), 2000);
    }
}

/// `del ssl cert` succeeded: `Certificate '<name>' deleted!` (2.6 to 3.2). Its refusals say
/// "deleted" too (`certificate '<name>' in use, can't be deleted!`, `… cannot be deleted, it is
/// used as default certificate …`): a certificate still served must not count as removed.
fn cert_deleted(reply: &str) -> bool {
    reply.starts_with("Certificate '") && reply.ends_with("' deleted!")
}

/// `del ssl crt-list` succeeded: `Entry '<cert>' deleted in crtlist '<list>'!`.
fn crt_list_entry_deleted(reply: &str) -> bool {
    reply.starts_with("Entry '")
        && reply.contains("' deleted in crtlist '")
        && reply.ends_with("'!")
}

#[cfg(test)]
mod reply_tests {
    use super::{cert_deleted, crt_list_entry_deleted};

    /// HAProxy's own words (2.6 and 3.2): success, and the refusals that also say "deleted".
    #[test]
    fn deletions_succeed_only_on_haproxys_success_replies() {
        assert!(cert_deleted(
            "Certificate '/etc/haproxy/ssl/b.pem' deleted!"
        ));
        assert!(!cert_deleted(
            "certificate '/etc/haproxy/ssl/b.pem' in use, can't be deleted!"
        ));
        assert!(!cert_deleted(
            "certificate '/etc/haproxy/ssl/b.pem' cannot be deleted, it is used as default certificate by the following frontends:\n  https"
        ));
        assert!(!cert_deleted("Can't find the certificate 'x'!"));
        assert!(crt_list_entry_deleted(
            "Entry '/etc/haproxy/ssl/b.pem' deleted in crtlist '/etc/haproxy/ssl/list.txt'!"
        ));
        assert!(!crt_list_entry_deleted(
            "Can't delete the entry: 'x' not found!"
        ));
        assert!(!crt_list_entry_deleted(
            "certificate 'x' in use, can't be deleted!"
        ));
    }
}
