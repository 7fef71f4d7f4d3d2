//! The direct connection against a real redis-server: order, pipelines, the writer, failures.

use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionInfo, IntoConnectionInfo, Value};
use test_support::RedisServer;

use super::*;
use crate::classify::{self, Classified};

const PATIENT: Duration = Duration::from_secs(10);

async fn connect(url: &str, response_timeout: Duration) -> DirectConnection {
    let info: ConnectionInfo = url.into_connection_info().unwrap();
    assert!(supports(&info), "{url}");
    DirectConnection::connect(&info, response_timeout)
        .await
        .unwrap()
}

fn echo(text: &str) -> Cmd {
    redis::cmd("ECHO").arg(text).clone()
}

fn bulk(text: &str) -> Value {
    Value::BulkString(text.as_bytes().to_vec())
}

/// Waits (bounded by [`PATIENT`]) until `done`.
async fn eventually(what: &str, done: impl FnMut() -> bool) {
    crate::testing::eventually(what, PATIENT, done).await;
}

/// Connects to `url` expecting the connect to fail, and returns why: `expected` says what.
async fn refused_connect(url: &str, expected: &str) -> redis::RedisError {
    let info: ConnectionInfo = url.into_connection_info().unwrap();
    DirectConnection::connect(&info, PATIENT)
        .await
        .err()
        .expect(expected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reply_goes_to_its_own_command_under_concurrency() {
    let server = RedisServer::start();
    let connection = connect(&server.url(), PATIENT).await;
    let mut tasks = Vec::new();
    for task in 0..32 {
        let connection = connection.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..200 {
                let text = format!("{task}-{n}");
                assert_eq!(connection.query(&echo(&text)).await.unwrap(), bulk(&text));
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_stay_in_order_when_most_writes_are_partial() {
    use redis::io::tcp::socket2::SockRef;
    let server = RedisServer::start();
    let connection = connect(&server.url(), PATIENT).await;
    // A send buffer far smaller than the commands, so that most of them are written in parts,
    // by their senders and by the writer, while other senders queue behind.
    let Socket::Tcp(stream) = &connection.shared.socket else {
        panic!("a TCP connection");
    };
    SockRef::from(stream).set_send_buffer_size(4096).unwrap();
    let mut tasks = Vec::new();
    for task in 0..16 {
        let connection = connection.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..40 {
                let text = format!("{task}-{n}-{}", "x".repeat(20_000 + 997 * n));
                assert_eq!(connection.query(&echo(&text)).await.unwrap(), bulk(&text));
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(connection.is_open());
}

#[tokio::test]
async fn a_pipeline_gets_one_reply_per_command_error_replies_included() {
    let server = RedisServer::start();
    let connection = connect(&server.url(), PATIENT).await;
    let mut pipe = redis::pipe();
    pipe.cmd("SET").arg("k").arg("v");
    pipe.cmd("INCR").arg("k");
    pipe.cmd("GET").arg("k");
    let replies = connection.query_pipeline(&pipe).await.unwrap();
    assert_eq!(replies.len(), 3, "{replies:?}");
    assert_eq!(replies[0], Value::Okay);
    assert!(
        matches!(&replies[1], Value::ServerError(e) if e.code() == "ERR"),
        "{replies:?}"
    );
    assert_eq!(replies[2], bulk("v"));
    // And the next command is answered by its own reply.
    assert_eq!(
        connection.query(&echo("after")).await.unwrap(),
        bulk("after")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_socket_does_not_take_is_written_later_in_order() {
    let server = RedisServer::start();
    let connection = connect(&server.url(), PATIENT).await;
    // 32 MiB, far more than a loopback socket's buffers hold while the server reads nothing.
    let big = "x".repeat(32 << 20);
    let paused = server.pause();
    let sending = {
        let connection = connection.clone();
        let big = big.clone();
        tokio::spawn(async move {
            let set = redis::cmd("SET").arg("big").arg(big).clone();
            connection.query(&set).await
        })
    };
    eventually("bytes left for the writer", || {
        !connection.shared.lock().unwritten.is_empty()
    })
    .await;
    // Sent while those bytes wait: it must go behind them, and get its own reply.
    let after = {
        let connection = connection.clone();
        tokio::spawn(async move {
            connection
                .query(&redis::cmd("STRLEN").arg("big").clone())
                .await
        })
    };
    eventually("the second command queued", || {
        connection.shared.lock().awaiting.len() == 2
    })
    .await;
    paused.resume();
    assert_eq!(sending.await.unwrap().unwrap(), Value::Okay);
    assert_eq!(after.await.unwrap().unwrap(), Value::Int(32 << 20));
    assert!(connection.shared.lock().unwritten.is_empty());
}

#[tokio::test]
async fn a_command_sent_while_bytes_wait_goes_behind_them() {
    let server = RedisServer::start();
    let connection = connect(&server.url(), PATIENT).await;
    // As if the socket had refused "first" a moment ago and the writer had not run yet.
    let first = echo("first").get_packed_command();
    let (reply_to, first_reply) = oneshot::channel();
    {
        let mut state = connection.shared.lock();
        state.unwritten.extend_from_slice(&first);
        state.awaiting.push_back(Awaiting {
            replies: 1,
            received: Vec::new(),
            reply_to,
        });
    }
    let second = {
        let connection = connection.clone();
        tokio::spawn(async move { connection.query(&echo("second")).await })
    };
    let both = first.len() + echo("second").get_packed_command().len();
    eventually("the second queued behind the first", || {
        connection.shared.lock().unwritten.len() == both
    })
    .await;
    connection.shared.unwritten_waiting.notify_one();
    assert_eq!(first_reply.await.unwrap().unwrap(), vec![bulk("first")]);
    assert_eq!(second.await.unwrap().unwrap(), bulk("second"));
}

#[tokio::test]
async fn a_reply_that_came_too_late_is_nobody_s_and_the_next_command_gets_its_own() {
    let server = RedisServer::start();
    // Long enough for a just-resumed server on a busy machine to answer the next command.
    let connection = connect(&server.url(), Duration::from_secs(1)).await;
    let paused = server.pause();
    let late = connection.query(&echo("late")).await.unwrap_err();
    assert!(
        matches!(&late, QueryError::Redis(e) if e.is_timeout()),
        "{late:?}"
    );
    paused.resume();
    assert_eq!(connection.query(&echo("next")).await.unwrap(), bulk("next"));
    assert!(connection.is_open());
}

#[tokio::test]
async fn a_broken_connection_fails_what_waits_and_then_refuses_to_write() {
    let server = RedisServer::start();
    let connection = connect(&server.url(), PATIENT).await;
    assert!(connection.is_open());
    let paused = server.pause();
    let waiting = {
        let connection = connection.clone();
        tokio::spawn(async move { connection.query(&echo("lost")).await })
    };
    eventually("the command written", || {
        !connection.shared.lock().awaiting.is_empty()
    })
    .await;
    // Killed while stopped, so that it can never answer: the kernel closes its sockets.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // Written, then lost: the server may have run it.
    let lost = waiting.await.unwrap().unwrap_err();
    assert!(
        matches!(classify::after_query(&lost), Classified::Indeterminate(_)),
        "{lost:?}"
    );
    assert!(!connection.is_open());
    // Never written: not applied.
    let refused = connection.query(&echo("after")).await.unwrap_err();
    assert!(
        matches!(classify::after_query(&refused), Classified::NotApplied(_)),
        "{refused:?}"
    );
    drop(paused);
}

/// The commands a [`fake_redis`] was sent, each as its arguments.
type Asked = Arc<std::sync::Mutex<Vec<Vec<String>>>>;

/// A server of our own on loopback for one connection: each command it reads (split as the
/// reader splits replies: the framing is the same) gets `answer`'s bytes, and the socket
/// stays open until the test ends.
async fn fake_redis(
    answer: impl Fn(&[String]) -> String + Send + 'static,
) -> (String, Asked, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let asked: Asked = Arc::default();
    let seen = Arc::clone(&asked);
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buffer = Vec::new();
        loop {
            let mut chunk = [0; 4096];
            let n = socket.read(&mut chunk).await.unwrap();
            if n == 0 {
                return;
            }
            buffer.extend_from_slice(&chunk[..n]);
            while let Some(length) = frame::reply_length(&buffer).unwrap() {
                let Value::Array(parts) = redis::parse_redis_value(&buffer[..length]).unwrap()
                else {
                    panic!("a command is an array");
                };
                buffer.drain(..length);
                let args: Vec<String> = parts
                    .into_iter()
                    .map(|part| match part {
                        Value::BulkString(bytes) => String::from_utf8(bytes).unwrap(),
                        other => panic!("{other:?}"),
                    })
                    .collect();
                let reply = answer(&args);
                seen.lock().unwrap().push(args);
                socket.write_all(reply.as_bytes()).await.unwrap();
            }
        }
    });
    (format!("redis://{addr}"), asked, server)
}

#[tokio::test]
async fn a_reply_to_no_command_closes_the_connection() {
    // A server that answers what nobody asked is not one whose replies can be matched.
    let (url, _, server) = fake_redis(|_| "+PONG\r\n+unasked\r\n".to_owned()).await;
    let connection = connect(&url, PATIENT).await;
    eventually("the connection closed", || !connection.is_open()).await;
    server.abort();
}

#[tokio::test]
async fn a_refused_auth_never_repeats_the_password() {
    // Some servers repeat a command's arguments in their error: the password among them.
    let (url, _, server) = fake_redis(|args| match args[0].as_str() {
        "AUTH" => format!(
            "-ERR unknown command 'AUTH', with args beginning with: {}\r\n",
            args[1..].join(" ")
        ),
        _ => "+PONG\r\n".to_owned(),
    })
    .await;
    let with_password = url.replace("redis://", "redis://lessee:pw-never-shown@");
    let refused = refused_connect(&with_password, "a refused AUTH fails the connect").await;
    assert_eq!(refused.kind(), ErrorKind::AuthenticationFailed);
    for text in [refused.to_string(), format!("{refused:?}")] {
        assert!(!text.contains("pw-never-shown"), "{text}");
    }
    server.abort();
}

#[tokio::test]
async fn a_server_without_users_is_sent_the_password_alone() {
    // Redis before 6 takes `AUTH password` only, and says so for `AUTH user password`.
    let (url, asked, server) = fake_redis(|args| match (args[0].as_str(), args.len()) {
        ("AUTH", 3) => "-ERR wrong number of arguments for 'auth' command\r\n".to_owned(),
        ("AUTH", _) => "+OK\r\n".to_owned(),
        _ => "+PONG\r\n".to_owned(),
    })
    .await;
    let with_password = url.replace("redis://", "redis://lessee:pw@");
    let connection = connect(&with_password, PATIENT).await;
    assert!(connection.is_open());
    let auths: Vec<Vec<String>> = asked
        .lock()
        .unwrap()
        .iter()
        .filter(|args| args[0] == "AUTH")
        .cloned()
        .collect();
    assert_eq!(auths, [vec!["AUTH", "lessee", "pw"], vec!["AUTH", "pw"]]);
    server.abort();
}

#[tokio::test]
async fn a_server_that_refuses_the_connection_fails_the_connect_not_a_command() {
    // Protected mode and `maxclients` answer a new connection with an error, unasked.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let (mut socket, _) = listener.accept().await.unwrap();
        socket
            .write_all(b"-ERR max number of clients reached\r\n")
            .await
            .unwrap();
        tokio::time::sleep(PATIENT).await;
    });
    // The connect fails (which the link reports as not applied), rather than succeeding and
    // handing the error to the first lease command as its reply (which would be unknown).
    refused_connect(&format!("redis://{addr}"), "the connect fails").await;
    server.abort();
}

#[tokio::test]
async fn past_its_limits_a_stalled_connection_refuses_commands_unwritten() {
    let server = RedisServer::start();
    let connection = connect(&server.url(), PATIENT).await;
    let not_written = |err: QueryError| matches!(err, QueryError::NotWritten(_));
    {
        let mut state = connection.shared.lock();
        for _ in 0..MAX_AWAITING {
            let (reply_to, _) = oneshot::channel();
            state.awaiting.push_back(Awaiting {
                replies: 1,
                received: Vec::new(),
                reply_to,
            });
        }
    }
    assert!(not_written(
        connection.query(&echo("one too many")).await.unwrap_err()
    ));
    {
        let mut state = connection.shared.lock();
        state.awaiting.clear();
        state.unwritten = vec![b' '; MAX_UNWRITTEN];
    }
    assert!(not_written(
        connection.query(&echo("too much")).await.unwrap_err()
    ));
    assert!(connection.is_open());
}

#[tokio::test]
async fn a_connection_whose_reader_stopped_is_closed() {
    let server = RedisServer::start();
    let connection = connect(&server.url(), PATIENT).await;
    connection._tasks._reader.abort();
    eventually("the connection closed", || !connection.is_open()).await;
    let refused = connection.query(&echo("unread")).await.unwrap_err();
    assert!(matches!(refused, QueryError::NotWritten(_)), "{refused:?}");
}

#[tokio::test]
async fn dropping_every_clone_stops_its_tasks_and_closes_the_socket() {
    let server = RedisServer::start();
    let connection = connect(&server.url(), PATIENT).await;
    let shared = Arc::downgrade(&connection.shared);
    let copy = connection.clone();
    drop(connection);
    assert_eq!(copy.query(&echo("still")).await.unwrap(), bulk("still"));
    drop(copy);
    eventually("the reader and the writer gone", || {
        shared.upgrade().is_none()
    })
    .await;
    eventually("the server's client gone", || {
        server
            .cmd(&["CLIENT", "LIST"])
            .as_string()
            .unwrap_or_default()
            .lines()
            .count()
            == 1
    })
    .await;
}

#[tokio::test]
async fn it_authenticates_and_selects_the_database_as_redis_rs_would() {
    let server = RedisServer::start();
    server.cmd(&[
        "ACL", "SETUSER", "lessee", "on", ">s3cret", "~*", "&*", "+@all",
    ]);
    let port = server.port();
    let connection = connect(
        &format!("redis://lessee:s3cret@127.0.0.1:{port}/3"),
        PATIENT,
    )
    .await;
    let info = connection
        .query(&redis::cmd("CLIENT").arg("INFO").clone())
        .await
        .unwrap();
    let text = match info {
        Value::BulkString(bytes) => String::from_utf8(bytes).unwrap(),
        other => panic!("CLIENT INFO: {other:?}"),
    };
    assert!(text.contains(" db=3 "), "{text}");
    assert!(text.contains(" user=lessee "), "{text}");
    let wrong = format!("redis://lessee:wrong@127.0.0.1:{port}");
    let refused = refused_connect(&wrong, "a wrong password is refused").await;
    assert_eq!(
        refused.kind(),
        ErrorKind::AuthenticationFailed,
        "{refused:?}"
    );
    assert_eq!(
        classify::connect_failure(&refused).cause,
        leasehold::UnavailableCause::NoPermission
    );
    // A database the server does not have is refused as redis-rs refuses it.
    let missing = format!("redis://lessee:s3cret@127.0.0.1:{port}/99");
    let refused = refused_connect(&missing, "database 99 is refused").await;
    assert_eq!(
        classify::connect_failure(&refused).cause,
        leasehold::UnavailableCause::NoSuchDatabase
    );
}

#[tokio::test]
async fn a_unix_socket_is_direct_too() {
    // A relative path is the server's own directory (`--dir` comes first).
    let server = RedisServer::start_with_args(&["--unixsocket", "redis.sock"]);
    let path = server.dir().join("redis.sock");
    let connection = connect(&format!("redis+unix://{}", path.display()), PATIENT).await;
    assert_eq!(
        connection.query(&echo("local")).await.unwrap(),
        bulk("local")
    );
}

#[test]
fn tls_and_resp3_stay_redis_rs_s() {
    for url in [
        "rediss://127.0.0.1:6379",
        "redis://127.0.0.1:6379?protocol=resp3",
    ] {
        let info: ConnectionInfo = url.into_connection_info().unwrap();
        assert!(!supports(&info), "{url}");
    }
}
