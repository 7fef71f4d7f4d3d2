//! The harness itself: servers start, pause, die and restart as the tests rely on.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use test_support::{FALLBACK_LOCATIONS, INSTALL_HINT, RedisServer, Reply, resolve_binary};

#[test]
fn a_started_server_answers_and_keeps_data() {
    let server = RedisServer::start();
    assert_eq!(server.cmd(&["PING"]), Reply::Status("PONG".into()));
    assert_eq!(server.cmd(&["SET", "k", "v"]), Reply::Status("OK".into()));
    assert_eq!(server.cmd(&["GET", "k"]).as_string(), Some("v".into()));
    assert_eq!(server.keys(), vec!["k".to_owned()]);
    assert!(server.commandstats().get("get").is_some_and(|&n| n >= 1));
    assert!(server.dir().is_dir());
}

#[test]
fn parallel_servers_get_their_own_ports() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    assert_ne!(a.port(), b.port());
    a.cmd(&["SET", "only-in-a", "1"]);
    assert!(b.keys().is_empty());
}

#[test]
fn a_paused_server_does_not_reply_until_resumed() {
    let server = RedisServer::start();
    let paused = server.pause();
    let mut stream = TcpStream::connect(server.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    stream.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut buf = [0u8; 16];
    let err = stream.read(&mut buf).expect_err("a stopped server replied");
    assert!(matches!(
        err.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ));
    paused.resume();
    // The queued PING is answered once the process runs again.
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let n = stream.read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"+PONG\r\n");
}

#[test]
fn a_killed_server_refuses_and_a_restarted_one_starts_empty() {
    let mut server = RedisServer::start();
    let port = server.port();
    server.cmd(&["SET", "k", "v"]);
    server.kill();
    let err = TcpStream::connect(server.addr()).expect_err("a killed server accepted");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    server.kill(); // idempotent
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(server.cmd(&["PING"]), Reply::Status("PONG".into()));
    assert!(server.keys().is_empty());
}

#[test]
fn a_missing_binary_fails_with_an_install_hint() {
    let missing = Some(OsString::from("/nonexistent/redis-server"));
    let err = resolve_binary(missing, None, FALLBACK_LOCATIONS).unwrap_err();
    assert!(err.contains("apt-get install"), "{err}");
    assert!(err.contains("LEASEHOLD_REDIS_SERVER"), "{err}");
    let err = resolve_binary(None, Some(OsString::from("/nonexistent-dir")), &[]).unwrap_err();
    assert_eq!(err, INSTALL_HINT);
}

#[test]
fn the_binary_is_found_on_path_or_by_override() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("redis-server");
    std::fs::write(&fake, "").unwrap();
    let found = resolve_binary(None, Some(dir.path().as_os_str().to_owned()), &[]).unwrap();
    assert_eq!(found, fake);
    let found = resolve_binary(Some(fake.clone().into_os_string()), None, &[]).unwrap();
    assert_eq!(found, fake);
}

#[test]
fn extra_args_reach_the_server() {
    let server = RedisServer::start_with_args(&["--maxmemory", "1mb"]);
    let reply = server.cmd(&["CONFIG", "GET", "maxmemory"]);
    assert_eq!(
        reply,
        Reply::Array(Some(vec![
            Reply::Bulk(Some(b"maxmemory".to_vec())),
            Reply::Bulk(Some(b"1048576".to_vec())),
        ]))
    );
    assert_eq!(
        server.cmd(&["CONFIG", "GET", "save"]),
        Reply::Array(Some(vec![
            Reply::Bulk(Some(b"save".to_vec())),
            Reply::Bulk(Some(Vec::new())),
        ]))
    );
    assert!(server.dir().join("redis.log").is_file());
}

#[test]
fn a_bad_arg_fails_start_with_the_server_s_own_message() {
    let panic =
        std::panic::catch_unwind(|| RedisServer::start_with_args(&["--no-such-option", "x"]))
            .expect_err("a server with a bad directive started");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("Bad directive"), "{message}");
}

#[test]
fn dropping_a_paused_server_kills_it() {
    let server = RedisServer::start();
    let addr = server.addr();
    std::mem::forget(server.pause()); // never resumed
    drop(server);
    let err = TcpStream::connect(addr).expect_err("a dropped server accepted");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
}

#[test]
fn replies_come_back_as_typed_values() {
    let server = RedisServer::start();
    assert_eq!(server.cmd(&["INCRBY", "n", "5"]), Reply::Int(5));
    assert_eq!(server.cmd(&["GET", "missing"]), Reply::Bulk(None));
    assert!(matches!(server.cmd(&["NOSUCHCOMMAND"]), Reply::Error(e) if e.starts_with("ERR")));
    let stats = server.commandstats();
    assert_eq!(stats.get("incrby"), Some(&1));
    server.cmd(&["SCRIPT", "LOAD", "return 1"]);
    assert_eq!(server.commandstats().get("script|load"), Some(&1));
}

#[test]
fn keys_scans_past_one_batch() {
    let server = RedisServer::start();
    let script = "for i = 1, 2500 do redis.call('SET', 'key:' .. i, i) end return 0";
    assert_eq!(server.cmd(&["EVAL", script, "0"]), Reply::Int(0));
    let keys = server.keys();
    assert_eq!(keys.len(), 2500);
    assert!(keys.contains(&"key:2500".to_owned()));
}

#[test]
fn a_cluster_serves_every_slot_and_redirects_the_rest() {
    let cluster = test_support::RedisCluster::start(3);
    assert_eq!(cluster.nodes().len(), 3);
    assert_eq!(cluster.urls().len(), 3);
    // Find one key per node; each is written where it belongs and redirected elsewhere.
    let mut seen = [false; 3];
    for i in 0..200 {
        let key = format!("k{i}");
        let owner = cluster.index_for_key(&key);
        if seen[owner] {
            continue;
        }
        seen[owner] = true;
        let node = cluster.node_for_key(&key);
        assert_eq!(node.cmd(&["SET", &key, "v"]), Reply::Status("OK".into()));
        for (j, other) in cluster.nodes().iter().enumerate() {
            if j != owner {
                match other.cmd(&["GET", &key]) {
                    Reply::Error(e) => assert!(e.starts_with("MOVED"), "{e}"),
                    other => panic!("expected MOVED, got {other:?}"),
                }
            }
        }
    }
    assert_eq!(seen, [true; 3], "200 keys all hashed to some nodes only");
    for node in cluster.nodes() {
        let info = node.cmd(&["CLUSTER", "INFO"]).as_string().unwrap();
        assert!(info.contains("cluster_state:ok"), "{info}");
    }
}

#[test]
fn a_sentinel_deployment_fails_over_to_its_replica() {
    let deployment = test_support::RedisSentinel::start();
    let first = deployment.master().port();
    assert_ne!(deployment.replica().port(), first);
    assert_eq!(
        deployment.master().cmd(&["SET", "k", "v"]),
        Reply::Status("OK".into())
    );
    assert_eq!(
        deployment.master().cmd(&["WAIT", "1", "5000"]),
        Reply::Int(1)
    );
    let promoted = deployment.failover();
    assert_ne!(promoted.port(), first);
    assert_eq!(promoted.cmd(&["GET", "k"]).as_string(), Some("v".into()));
    assert_eq!(deployment.sentinel_urls().len(), 1);
}

#[test]
fn the_proxy_passes_holds_and_resets_per_direction() {
    use test_support::{FaultProxy, ProxyFault};
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let ping = |timeout: Duration| -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect(proxy.addr())?;
        stream.set_read_timeout(Some(timeout))?;
        stream.write_all(b"*1\r\n$4\r\nPING\r\n")?;
        let mut buf = [0u8; 7];
        stream.read_exact(&mut buf)?;
        Ok(buf.to_vec())
    };
    assert_eq!(ping(Duration::from_secs(2)).unwrap(), b"+PONG\r\n");
    // A request lost on the way: the server never sees it.
    let before = server.commandstats().get("ping").copied().unwrap_or(0);
    proxy.to_server(ProxyFault::Reset);
    assert!(ping(Duration::from_secs(2)).is_err());
    assert_eq!(
        server.commandstats().get("ping").copied().unwrap_or(0),
        before
    );
    proxy.to_server(ProxyFault::Pass);
    // A reply lost on the way back: the server ran the command, the client got a reset.
    proxy.to_client(ProxyFault::Reset);
    assert!(ping(Duration::from_secs(2)).is_err());
    assert_eq!(server.commandstats().get("ping").copied(), Some(before + 1));
    // A held reply arrives once released.
    proxy.to_client(ProxyFault::Hold);
    let mut stream = TcpStream::connect(proxy.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    stream.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut buf = [0u8; 7];
    assert!(stream.read_exact(&mut buf).is_err(), "a held reply arrived");
    proxy.to_client(ProxyFault::Pass);
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    stream.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"+PONG\r\n");
}
