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
            &haproxy_bin(),
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
    // A rotated Secret is followed without a restart, as the controller follows its copy; a
    // rotation that leaves the password empty keeps the last good credentials.
    std::fs::write(creds.join("password.new"), "n3w-secret\n").unwrap();
    std::fs::rename(creds.join("password.new"), creds.join("password")).unwrap();
    let rotated = format!(
        "Basic {}",
        haptic_agent::base64::encode(b"admin:n3w-secret")
    );
    let status = |auth: &str| {
        plain
            .get(&url)
            .header("Authorization", auth)
            .call()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!((status(&rotated), status(&right)), (200, 401));
    std::fs::write(creds.join("password.new"), "").unwrap();
    std::fs::rename(creds.join("password.new"), creds.join("password")).unwrap();
    assert_eq!(status(&rotated), 200, "an empty password was taken");
    assert_eq!(
        status("Basic YWRtaW46"),
        401,
        "admin with an empty password"
    );

    // Without credentials, a body is never read: announcing 60 MB (under the limit) and
    // sending none of it gets the 401 at once, not after the body or a timeout.
    for auth in ["", "Authorization: Basic YWRtaW46bm9wZQ==\r\n"] {
        let mut s = TcpStream::connect((ip.as_str(), api)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "PUT /v1/bundle HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: 60000000\r\n\r\n"
        )
        .unwrap();
        let mut answer = [0u8; 12];
        s.read_exact(&mut answer)
            .expect("an answer before the body was sent");
        assert_eq!(&answer, b"HTTP/1.1 401", "{auth:?}");
    }
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
            &haproxy_bin(),
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

/// With `--client-name`, a certificate of the client CA must also name the controller: the
/// chart's CA issues the agents' own certificates too (with Helm's generator, usable as client
/// certificates), and a pod holding one must not pass for the controller. A certificate without
/// subjectAltName, as the chart issued before, is read by its common name.
#[test]
fn mtls_with_a_client_name_refuses_other_certificates_of_the_same_ca() {
    use ureq::tls::{Certificate, ClientCert as UreqCert, PrivateKey, RootCerts, TlsConfig};
    let env = Env::start(Options {
        agent_args: vec!["--client-name".into(), "haptic-controller".into()],
        ..Options::default()
    });
    let ca_dir = &certs().dir;
    let dir = env.root.join("issued");
    std::fs::create_dir_all(&dir).unwrap();
    // A client certificate of the same CA: CN `cn`, extensions `ext` (an openssl extfile).
    let issue = |name: &str, cn: &str, ext: &str| -> ureq::Agent {
        let (key, csr, crt, extfile) = (
            dir.join(format!("{name}.key")),
            dir.join(format!("{name}.csr")),
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.ext")),
        );
        std::fs::write(&extfile, ext).unwrap();
        let run = |args: &[&std::ffi::OsStr]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let s = |p: &std::path::Path| p.as_os_str().to_owned();
        run(&[
            "genpkey".as_ref(),
            "-algorithm".as_ref(),
            "EC".as_ref(),
            "-pkeyopt".as_ref(),
            "ec_paramgen_curve:P-256".as_ref(),
            "-out".as_ref(),
            &s(&key),
        ]);
        run(&[
            "req".as_ref(),
            "-new".as_ref(),
            "-key".as_ref(),
            &s(&key),
            "-subj".as_ref(),
            format!("/CN={cn}").as_ref(),
            "-out".as_ref(),
            &s(&csr),
        ]);
        run(&[
            "x509".as_ref(),
            "-req".as_ref(),
            "-in".as_ref(),
            &s(&csr),
            "-CA".as_ref(),
            &s(&ca_dir.join("ca.crt")),
            "-CAkey".as_ref(),
            &s(&ca_dir.join("ca.key")),
            "-set_serial".as_ref(),
            "7".as_ref(),
            "-days".as_ref(),
            "2".as_ref(),
            "-extfile".as_ref(),
            &s(&extfile),
            "-out".as_ref(),
            &s(&crt),
        ]);
        let read = |p: &std::path::Path| std::fs::read(p).unwrap();
        let tls = TlsConfig::builder()
            .root_certs(RootCerts::new_with_certs(&[Certificate::from_pem(&read(
                &ca_dir.join("ca.crt"),
            ))
            .unwrap()]))
            .client_cert(Some(UreqCert::new_with_certs(
                &[Certificate::from_pem(&read(&crt)).unwrap()],
                PrivateKey::from_pem(&read(&key)).unwrap(),
            )))
            .build();
        ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .build()
            .into()
    };
    let both = "extendedKeyUsage=clientAuth,serverAuth\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n";
    let url = env.url("/v1/state");
    let status = |agent: &ureq::Agent| agent.get(&url).call().map(|r| r.status().as_u16()).ok();
    // Refused: an agent's certificate (as Helm issues it, for both uses), and one that names
    // the controller only in its CN while its subjectAltName names another.
    let agent_like = issue(
        "agent-like",
        "haptic-agent",
        &format!("subjectAltName=DNS:haptic-agent\n{both}"),
    );
    assert_eq!(
        status(&agent_like),
        None,
        "an agent's certificate passed for the controller"
    );
    let cn_only = issue(
        "cn-only",
        "haptic-controller",
        &format!("subjectAltName=DNS:other.example\n{both}"),
    );
    assert_eq!(
        status(&cn_only),
        None,
        "a CN without a matching subjectAltName passed"
    );
    // Refused: several common names (issuers and readers disagree on which counts), and
    // subjectAltNames that are not strict DER, which another parser reads differently (a
    // multi-byte tag hiding the name; bytes after it).
    let two_cns = issue("two-cns", "haptic-agent/CN=haptic-controller", both);
    assert_eq!(status(&two_cns), None, "one of several common names passed");
    let name_hex: Vec<String> = b"haptic-controller"
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name_hex = name_hex.join(":");
    let hidden = issue(
        "hidden",
        "x",
        &format!("subjectAltName=DER:30:16:9f:01:13:82:11:{name_hex}\n{both}"),
    );
    assert_eq!(
        status(&hidden),
        None,
        "a name behind a multi-byte tag passed"
    );
    let trailing = issue(
        "trailing",
        "x",
        &format!("subjectAltName=DER:30:15:82:11:{name_hex}:82:7f\n{both}"),
    );
    assert_eq!(
        status(&trailing),
        None,
        "a subjectAltName with bytes after the name passed"
    );
    // Accepted: the controller's certificate (scripts/gen-certs.sh: subjectAltName), one whose
    // name differs in case, and a certificate without subjectAltName whose CN names it.
    assert_eq!(status(&env.client), Some(200));
    let upper = issue(
        "upper",
        "x",
        &format!("subjectAltName=DNS:HAPTIC-Controller\n{both}"),
    );
    assert_eq!(status(&upper), Some(200));
    let legacy = issue("legacy", "haptic-controller", both);
    assert_eq!(
        status(&legacy),
        Some(200),
        "a certificate of the chart before subjectAltName"
    );
    assert!(
        env.agent_log().contains("does not name haptic-controller"),
        "the refusal is logged: {}",
        env.agent_log()
    );
    assert!(
        env.agent_log()
            .contains("accepted a client certificate by its common name"),
        "the legacy certificate is named in the log: {}",
        env.agent_log()
    );
    // A name that cannot be a DNS name stops the agent at start.
    for bad in ["", "haptic controller"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_haptic-agent"))
            .args([
                "serve",
                "--config-dir",
                "/nonexistent",
                "--master-socket",
                "/nonexistent",
            ])
            .args([
                "--tls-cert",
                "x",
                "--tls-key",
                "x",
                "--client-ca",
                "x",
                "--client-name",
                bad,
            ])
            .output()
            .unwrap();
        assert!(!out.status.success(), "--client-name {bad:?} was taken");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("expected a DNS name"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
