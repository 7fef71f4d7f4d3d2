//! Privacy.

use super::*;

/// Every command the server runs, in order, as `MONITOR` reports it on a raw connection:
/// keys, arguments, channels, and the commands the scripts run.
struct Monitor {
    stream: TcpStream,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Monitor {
    fn start(server: &RedisServer) -> Self {
        let stream = TcpStream::connect(server.addr()).expect("connects");
        let mut reader = BufReader::new(stream.try_clone().expect("a second handle"));
        let mut ok = String::new();
        (&stream).write_all(b"MONITOR\r\n").expect("sent");
        reader.read_line(&mut ok).expect("a reply");
        assert_eq!(ok, "+OK\r\n");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let reader = std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Self {
            stream,
            lines,
            reader: Some(reader),
        }
    }

    /// Returns every command the server has run so far: a marker sent now comes after them.
    fn seen(&self, server: &RedisServer) -> Vec<String> {
        let marker = format!("end-of-test-{}", std::process::id());
        server.cmd(&["ECHO", &marker]);
        wait_until("the marker in MONITOR", || {
            let lines = self.lines.lock().unwrap();
            lines
                .iter()
                .any(|l| l.contains(&marker))
                .then(|| lines.clone())
        })
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// The owner tokens in MONITOR lines: quoted arguments of 32 Base64URL characters (24 bytes).
fn tokens_in(lines: &[String]) -> BTreeSet<String> {
    lines
        .iter()
        .flat_map(|line| line.split('"').skip(1).step_by(2))
        // Inside scripts the stored value `fence:token:operation` goes by too.
        .flat_map(|arg| arg.split(':'))
        .filter(|part| {
            part.len() == 32
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_raw_resource_name_never_reaches_redis_and_no_token_is_printed() {
    let server = RedisServer::start();
    let monitor = Monitor::start(&server);
    let scratch = Scratch::new();
    let name = "customer-8812-private-name";
    let mut outputs: Vec<Finished> = Vec::new();

    // A holder, and while it holds: inspect both ways, and a run that waits on it (it watches
    // the release channel) and gives up, printing the holder it met.
    let mut command = leasehold(&server.url());
    command
        .args(["run", name, "--"])
        .args(scratch.sh(r#"echo started > "$D/started"
           i=0; while [ ! -e "$D/go" ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done"#));
    let holder = Running::start(command);
    wait_for_file(&scratch.path("started"));
    for argv in [&["inspect", name][..], &["inspect", name, "--json"]] {
        let mut command = leasehold(&server.url());
        command.args(argv);
        outputs.push(run_to_end(command));
    }
    let mut command = leasehold(&server.url());
    command.args(["run", name, "--wait", "300ms", "--", "true"]);
    outputs.push(run_to_end(command));
    std::fs::write(scratch.path("go"), "").unwrap();
    outputs.push(holder.finish());
    // Free again: a run of its own, and the demo on this server.
    let mut command = leasehold(&server.url());
    command.args(["run", name, "--", "true"]);
    outputs.push(run_to_end(command));
    let mut command = leasehold(&server.url());
    command.arg("demo");
    outputs.push(run_to_end(command));

    let codes: Vec<i32> = outputs.iter().map(Finished::code).collect();
    assert_eq!(codes, [0, 0, 75, 0, 0, 0], "{outputs:#?}");
    // What the outputs say about the holder is its fingerprint.
    assert!(outputs[0].stdout.contains("held by "), "{outputs:#?}");
    assert!(outputs[2].stderr.contains("held by "), "{outputs:#?}");

    let seen = monitor.seen(&server);
    let digest = ResourceDigest::of(name);
    let digest_hex = &digest.as_str()["sha256:".len()..];
    assert!(
        seen.iter().any(|l| l.contains(digest_hex)),
        "nothing about the resource was seen: {seen:#?}"
    );
    assert!(
        seen.iter()
            .any(|l| l.to_ascii_uppercase().contains("SUBSCRIBE")),
        "the waiting run's channel was not seen: {seen:#?}"
    );
    for line in &seen {
        assert!(!line.contains(name), "{line}");
    }
    // Four runs' attempts and the demo's two workers.
    let tokens = tokens_in(&seen);
    assert!(tokens.len() >= 5, "{tokens:?}");
    for done in &outputs {
        for token in &tokens {
            assert!(
                !done.stdout.contains(token.as_str()) && !done.stderr.contains(token.as_str()),
                "a token was printed: {done:#?}"
            );
        }
    }
    for key in server.keys() {
        assert!(!key.contains(name), "{key}");
    }
}

#[test]
fn trace_logs_of_a_whole_run_show_no_token_password_or_resource_name() {
    let password = "pw-cli-3e9d-never-logged";
    let server = RedisServer::start_with_args(&[
        "--user",
        "app",
        "on",
        &format!(">{password}"),
        "~*",
        "&*",
        "+@all",
    ]);
    let monitor = Monitor::start(&server);
    let name = "customer-4471-private-name";
    let url = format!("redis://app:{password}@127.0.0.1:{}", server.port());
    let mut outputs = Vec::new();
    // A run that renews (600 ms TTL), one that is contended and waits, and an inspection.
    let mut command = leasehold(&url);
    command.args(["-vv", "run", name, "--ttl", "600ms", "--", "sleep", "0.5"]);
    let holder = Running::start(command);
    wait_until("the holder's grant", || {
        (server.keys().len() >= 2).then_some(())
    });
    let mut command = leasehold(&url);
    command.args(["-vv", "run", name, "--wait", "3s", "--", "true"]);
    outputs.push(run_to_end(command));
    outputs.push(holder.finish());
    let mut command = leasehold(&url);
    command
        .env("LEASEHOLD_LOG", "trace")
        .args(["inspect", name]);
    outputs.push(run_to_end(command));
    let codes: Vec<i32> = outputs.iter().map(Finished::code).collect();
    assert_eq!(codes, [0, 0, 0], "{outputs:#?}");
    for done in &outputs[..2] {
        assert!(done.stderr.contains("released the lease"), "{done:#?}");
    }
    // The waiter's tries are traced.
    assert!(
        outputs[0].stderr.contains("TRACE"),
        "not traced: {outputs:#?}"
    );
    assert!(outputs[1].stderr.contains("renewed"), "{outputs:#?}");

    let tokens = tokens_in(&monitor.seen(&server));
    assert!(tokens.len() >= 2, "{tokens:?}");
    for done in &outputs {
        let printed = format!("{}{}", done.stdout, done.stderr);
        for token in &tokens {
            assert!(
                !printed.contains(token.as_str()),
                "a token was printed: {done:#?}"
            );
        }
        assert!(
            !printed.contains(password),
            "the password was printed: {done:#?}"
        );
        // (stdout may repeat the name the user typed, as inspect's answer does; logs never.)
        assert!(
            !done.stderr.contains(name),
            "the resource's name was logged: {done:#?}"
        );
    }
}
