//! Who may talk to the agent and what it refuses to read: mutual TLS, the explicit basic-auth
//! legacy mode, path confinement and size limits.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::Duration;

use haptic_agent::protocol::{Bundle, FileKind};
use support::*;

fn small_bundle(env: &Env, files: Vec<haptic_agent::protocol::BundleFile>) -> Bundle {
    let cfg = format!(
        "{}frontend fe\n    bind {}\n    http-request return status 200\n",
        env.global(),
        env.fe
    );
    Bundle::new(cfg, files)
}

#[test]
fn mtls_refuses_missing_foreign_and_expired_client_certificates() {
    let env = Env::start(Options::default());
    let url = env.url("/v1/state");
    for (name, cert) in [
        ("no certificate", ClientCert::None),
        ("foreign CA", ClientCert::Foreign),
        ("expired", ClientCert::Expired),
    ] {
        let result = client(cert).get(&url).call();
        assert!(
            result.is_err(),
            "{name}: request was accepted: {:?}",
            result.map(|r| r.status())
        );
    }
    // Plain HTTP on the TLS port gets no API answer.
    let mut s = TcpStream::connect((env.ip.as_str(), env.api_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /v1/state HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert!(
        !String::from_utf8_lossy(&out).contains("HTTP/1.1 200"),
        "plain HTTP answered"
    );

    let mut ok = env
        .client
        .get(&url)
        .call()
        .expect("valid client certificate accepted");
    assert_eq!(ok.status().as_u16(), 200);
    assert!(ok.body_mut().read_to_string().unwrap().contains("\"mode\""));
    let log = env.agent_log();
    assert!(
        log.contains("peer sent no certificates"),
        "missing certificate logged:\n{log}"
    );
    assert!(log.contains("certificate expired"), "expiry logged:\n{log}");
    assert!(
        log.matches("TLS handshake refused").count() >= 3,
        "every refusal logged:\n{log}"
    );
}

#[test]
fn path_traversal_symlinks_bad_input_and_oversized_bodies_are_refused() {
    let env = Env::start(Options {
        agent_args: vec!["--max-body-bytes".into(), "200000".into()],
        ..Options::default()
    });
    let cases = [
        ("../escape.map", "must stay inside"),
        ("maps/../../escape.map", "must stay inside"),
        ("/etc/haproxy/abs.map", "is absolute"),
        (".haptic/state.json", "hidden component"),
        ("maps/with space.map", "contains the character"),
    ];
    for (path, expected) in cases {
        let (status, body) = env.put(&small_bundle(
            &env,
            vec![file(FileKind::Map, path, "k v\n")],
        ));
        assert_eq!(status, 400, "{path}: {body:#}");
        assert_eq!(body["error"], "invalid_path");
        assert!(
            body["detail"].as_str().unwrap().contains(expected),
            "{path}: {body:#}"
        );
    }
    let outside = temp_dir("outside");
    std::os::unix::fs::symlink(&outside, env.cfg_dir.join("maps")).unwrap();
    let (status, body) = env.put(&small_bundle(
        &env,
        vec![file(FileKind::Map, "maps/x.map", "k v\n")],
    ));
    assert_eq!(status, 400, "{body:#}");
    assert!(
        body["detail"].as_str().unwrap().contains("is a symlink"),
        "{body:#}"
    );
    assert!(
        std::fs::read_dir(&outside).unwrap().next().is_none(),
        "nothing written through the symlink"
    );
    let _ = std::fs::remove_dir_all(&outside);

    let big = "x".repeat(300_000);
    let (status, body) = env.put(&small_bundle(
        &env,
        vec![file(FileKind::General, "general/big", &big)],
    ));
    assert_eq!(status, 413, "{body:#}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("exceeds the limit of 200000 bytes"),
        "{body:#}"
    );

    let put_raw = |raw: &str| {
        let mut resp = env.client.put(&env.url("/v1/bundle")).send(raw).unwrap();
        let status = resp.status().as_u16();
        (status, resp.body_mut().read_to_string().unwrap())
    };
    let (status, text) = put_raw("{not json");
    assert_eq!(status, 400);
    assert!(text.contains("body is not a bundle"), "{text}");
    let (status, text) =
        put_raw(r#"{"haproxy_cfg": "", "files": [{"kind": "exe", "path": "x", "content": ""}]}"#);
    assert_eq!(status, 400);
    assert!(text.contains("unknown kind"), "{text}");

    let state = env.state();
    assert!(state["bundle"].is_null(), "nothing was applied: {state:#}");
}

#[test]
fn insecure_basic_auth_mode_requires_the_credentials() {
    let env = Env::start(Options::default());
    let creds = env.root.join("creds");
    std::fs::create_dir_all(&creds).unwrap();
    std::fs::write(creds.join("username"), "admin\n").unwrap();
    std::fs::write(creds.join("password"), "s3cret\n").unwrap();
    let (ip, api, probes) = (agent_loopback(), 5555, 5556);
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_haptic-agent"))
        .arg("serve")
        .arg("--config-dir")
        .arg(&env.cfg_dir)
        .arg("--master-socket")
        .arg(&env.master)
        .args([
            "--haproxy-bin",
            HAPROXY,
            "--listen",
            &format!("{ip}:{api}"),
            "--probe-listen",
            &format!("{ip}:{probes}"),
        ])
        .arg("--insecure-http-with-basic-auth")
        .arg("--credentials")
        .arg(&creds)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start agent");
    let _guard = Proc {
        child,
        name: "basic-auth agent",
        group: false,
    };
    wait_for("basic-auth agent", Duration::from_secs(10), || {
        probe(&ip, probes, "/healthz").ok()
    });
    let plain: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let url = format!("http://{ip}:{api}/v1/state");
    assert_eq!(plain.get(&url).call().unwrap().status().as_u16(), 401);
    let wrong = format!("Basic {}", haptic_agent::base64::encode(b"admin:nope"));
    assert_eq!(
        plain
            .get(&url)
            .header("Authorization", &wrong)
            .call()
            .unwrap()
            .status()
            .as_u16(),
        401
    );
    let right = format!("Basic {}", haptic_agent::base64::encode(b"admin:s3cret"));
    assert_eq!(
        plain
            .get(&url)
            .header("Authorization", &right)
            .call()
            .unwrap()
            .status()
            .as_u16(),
        200
    );
}

#[test]
fn rotated_tls_files_are_picked_up_without_a_restart() {
    let env = Env::start(Options::default());
    let tls = env.root.join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    let install = |from: &std::path::Path| {
        for name in ["agent.crt", "agent.key", "ca.crt"] {
            // Replace by rename, as a Secret volume update does.
            std::fs::copy(from.join(name), tls.join(format!("{name}.new"))).unwrap();
            std::fs::rename(tls.join(format!("{name}.new")), tls.join(name)).unwrap();
        }
    };
    install(&certs().dir);
    let (ip, api, probes) = (agent_loopback(), 5555, 5556);
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_haptic-agent"))
        .arg("serve")
        .arg("--config-dir")
        .arg(&env.cfg_dir)
        .arg("--master-socket")
        .arg(&env.master)
        .args([
            "--haproxy-bin",
            HAPROXY,
            "--listen",
            &format!("{ip}:{api}"),
            "--probe-listen",
            &format!("{ip}:{probes}"),
        ])
        .arg("--tls-cert")
        .arg(tls.join("agent.crt"))
        .arg("--tls-key")
        .arg(tls.join("agent.key"))
        .arg("--client-ca")
        .arg(tls.join("ca.crt"))
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start agent");
    let _guard = Proc {
        child,
        name: "rotating agent",
        group: false,
    };
    wait_for("rotating agent", Duration::from_secs(10), || {
        probe(&ip, probes, "/healthz").ok()
    });
    let url = format!("https://{ip}:{api}/v1/state");
    let status = |c: ClientCert| client(c).get(&url).call().map(|r| r.status().as_u16()).ok();
    assert_eq!(status(ClientCert::Valid), Some(200));
    assert_eq!(status(ClientCert::OtherSet), None);

    install(&certs().other);
    wait_for(
        "the rotated certificates to be used",
        Duration::from_secs(10),
        || (status(ClientCert::OtherSet) == Some(200)).then_some(()),
    );
    assert_eq!(
        status(ClientCert::Valid),
        None,
        "the old CA is no longer trusted"
    );

    // A broken rotation keeps the working configuration.
    std::fs::write(tls.join("agent.key"), "garbage").unwrap();
    assert_eq!(status(ClientCert::OtherSet), Some(200));
}

#[test]
fn idle_unauthenticated_connections_do_not_lock_the_controller_out() {
    let env = Env::start(Options::default());
    // A peer without a certificate opens many connections and never starts a handshake.
    let flood: Vec<TcpStream> = (0..200)
        .filter_map(|_| connect_from([127, 0, 0, 2], &env.ip, env.api_port).ok())
        .collect();
    assert!(
        flood.len() >= 100,
        "only {} connections opened",
        flood.len()
    );
    // Meanwhile the controller (with its certificate, from its own address) keeps asking.
    for i in 0..10 {
        let result = env.client.get(&env.url("/v1/state")).call();
        assert_eq!(
            result
                .map(|r| r.status().as_u16())
                .map_err(|e| e.to_string()),
            Ok(200),
            "request {i} during the flood"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // The flood's connections are closed: most at once (per-peer limit), the rest when the
    // handshake deadline passes. None is kept open.
    for (i, mut s) in flood.into_iter().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = [0u8; 16];
        match s.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("flood connection {i} still open: {other:?}"),
        }
    }
}

/// `--help` after a subcommand prints the usage (it used to be taken for a flag missing its
/// value), and exits 0 without starting anything.
#[test]
fn help_after_a_subcommand_prints_the_usage() {
    for args in [&["serve", "--help"][..], &["init", "-h"], &["--help"]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_haptic-agent"))
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("haptic-agent serve --config-dir"),
            "{args:?}: {stdout}"
        );
    }
}
