//! A connection to one server that writes each command from the task that sends it.
//!
//! redis-rs's `MultiplexedConnection` hands every command to a task of its own, which then
//! writes it: before a command leaves, another thread has to be woken and scheduled. On a
//! small machine that hand-off is about a tenth of a one-task acquire+release (D49). Here the
//! sending task writes the command itself, under the lock that records whose reply comes
//! next, so commands leave in the order they took the lock and replies are matched in that
//! order. One task per connection reads the replies and hands each to its command. Bytes the
//! socket does not take at once wait, in order, for a second task that writes them when the
//! socket can take more; commands sent meanwhile queue behind them.
//!
//! It speaks only what it needs, exactly as redis-rs would: plain TCP or a Unix socket, RESP2,
//! `AUTH` and `SELECT`. TLS and RESP3 connections stay redis-rs's ([`supports`]).
//!
//! A connection is closed for good by the first failure to read or write: every command
//! waiting for a reply then fails as a lost connection (the server may have run it), and a
//! command sent after that fails the same way without being written. [`is_open`] tells the
//! link to make a new connection instead of sending on this one.
//!
//! [`is_open`]: DirectConnection::is_open

mod frame;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::{Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisResult, Value};
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;
use tokio::sync::{Notify, oneshot};
use tokio_util::task::AbortOnDropHandle;

/// How much the reader asks the socket for at a time.
const READ_CHUNK: usize = 16 * 1024;

/// Returns true if and only if a [`DirectConnection`] can stand in for redis-rs's connection
/// to `info`: plain TCP or a Unix socket, and RESP2.
pub(crate) fn supports(info: &ConnectionInfo) -> bool {
    let plain = match info.addr() {
        ConnectionAddr::Tcp(..) => true,
        #[cfg(unix)]
        ConnectionAddr::Unix(_) => true,
        _ => false,
    };
    plain && !info.redis_settings().protocol().supports_resp3()
}

/// A connection whose commands are written by the tasks that send them. Cheap to clone;
/// clones share it, and its two tasks stop when the last clone is dropped.
#[derive(Clone)]
pub(crate) struct DirectConnection {
    shared: Arc<Shared>,
    _tasks: Arc<Tasks>,
}

/// The reader and the writer, stopped when dropped.
struct Tasks {
    _reader: AbortOnDropHandle<()>,
    _writer: AbortOnDropHandle<()>,
}

struct Shared {
    socket: Socket,
    state: Mutex<State>,
    /// Wakes the writer when bytes wait in [`State::unwritten`].
    unwritten_waiting: Notify,
    /// Set once the connection is closed, for [`DirectConnection::is_open`] to read without
    /// the lock.
    closed: AtomicBool,
    response_timeout: Duration,
}

/// What the lock guards: the order of the replies and of the bytes still to write.
struct State {
    /// One entry per command written or queued, in the order its bytes were.
    awaiting: VecDeque<Awaiting>,
    /// Commands' bytes the socket has not taken yet, in order, for the writer.
    unwritten: Vec<u8>,
    /// Why the connection closed, once it has.
    closed: Option<io::ErrorKind>,
}

/// A command waiting for its replies (one per command it carries: a pipeline has several).
struct Awaiting {
    replies: usize,
    received: Vec<Value>,
    reply_to: oneshot::Sender<RedisResult<Vec<Value>>>,
}

enum Socket {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

impl Socket {
    fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.try_write(bytes),
            #[cfg(unix)]
            Socket::Unix(s) => s.try_write(bytes),
        }
    }

    fn try_read(&self, buffer: &mut Vec<u8>) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.try_read_buf(buffer),
            #[cfg(unix)]
            Socket::Unix(s) => s.try_read_buf(buffer),
        }
    }

    async fn writable(&self) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.writable().await,
            #[cfg(unix)]
            Socket::Unix(s) => s.writable().await,
        }
    }

    async fn readable(&self) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.readable().await,
            #[cfg(unix)]
            Socket::Unix(s) => s.readable().await,
        }
    }
}

impl DirectConnection {
    /// Connects to `info`'s server and authenticates and selects its database as redis-rs
    /// would, each reply awaited for at most `response_timeout`, like every command's after.
    ///
    /// # Errors
    ///
    /// The connection's failure, or the server's refusal of `AUTH` or `SELECT`, as redis-rs
    /// reports them (the link classifies both); an address [`supports`] refuses.
    pub(crate) async fn connect(
        info: &ConnectionInfo,
        response_timeout: Duration,
    ) -> RedisResult<Self> {
        let socket = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let stream = TcpStream::connect((host.as_str(), *port)).await?;
                // Each command is written whole, at once: Nagle's algorithm would only hold
                // back the commands of other tasks behind an unacknowledged one.
                stream.set_nodelay(true)?;
                Socket::Tcp(stream)
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => Socket::Unix(UnixStream::connect(path).await?),
            _ => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "a direct connection is plain TCP or a Unix socket",
                )));
            }
        };
        let connection = Self::over(socket, response_timeout);
        let settings = info.redis_settings();
        let mut setup = redis::pipe();
        if let Some(password) = settings.password() {
            let auth = setup.cmd("AUTH");
            if let Some(username) = settings.username() {
                auth.arg(username);
            }
            auth.arg(password);
        }
        if settings.db() != 0 {
            setup.cmd("SELECT").arg(settings.db());
        }
        if !setup.is_empty() {
            for reply in connection.query_pipeline(&setup).await? {
                if let Value::ServerError(refused) = reply {
                    // The server's own error ("WRONGPASS …", "ERR DB index is out of range"):
                    // it says which step failed, and never holds the password.
                    return Err(refused.into());
                }
            }
        }
        Ok(connection)
    }

    /// A connection over `socket`, with its reader and writer started.
    fn over(socket: Socket, response_timeout: Duration) -> Self {
        let shared = Arc::new(Shared {
            socket,
            state: Mutex::new(State {
                awaiting: VecDeque::new(),
                unwritten: Vec::new(),
                closed: None,
            }),
            unwritten_waiting: Notify::new(),
            closed: AtomicBool::new(false),
            response_timeout,
        });
        let tasks = Tasks {
            _reader: AbortOnDropHandle::new(tokio::spawn(read_replies(Arc::clone(&shared)))),
            _writer: AbortOnDropHandle::new(tokio::spawn(write_unwritten(Arc::clone(&shared)))),
        };
        Self {
            shared,
            _tasks: Arc::new(tasks),
        }
    }

    /// Returns true if and only if the connection has not closed: a command sent on it will
    /// be written.
    pub(crate) fn is_open(&self) -> bool {
        !self.shared.closed.load(Ordering::Acquire)
    }

    /// Sends one command and returns its reply (an error reply is a `Value::ServerError`).
    ///
    /// # Errors
    ///
    /// The connection closed (before the reply, or before the command was written), or no
    /// reply came within the response timeout.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the command was written leaves it to run: its reply is read
    /// and discarded, and the replies of later commands still go to them.
    pub(crate) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        let mut replies = self.send(&cmd.get_packed_command(), 1).await?;
        Ok(replies.pop().unwrap_or(Value::Nil))
    }

    /// Sends a pipeline's commands in one write and returns their replies, in order.
    ///
    /// # Errors
    ///
    /// As [`query`](Self::query).
    ///
    /// # Cancel safety
    ///
    /// As [`query`](Self::query).
    pub(crate) async fn query_pipeline(&self, pipe: &Pipeline) -> RedisResult<Vec<Value>> {
        self.send(&pipe.get_packed_pipeline(), pipe.len()).await
    }

    async fn send(&self, bytes: &[u8], replies: usize) -> RedisResult<Vec<Value>> {
        let (reply_to, reply) = oneshot::channel();
        {
            let mut state = self.shared.lock();
            if let Some(kind) = state.closed {
                return Err(io::Error::new(kind, "the connection had closed: not sent").into());
            }
            if state.unwritten.is_empty() {
                match self.shared.socket.try_write(bytes) {
                    Ok(written) if written == bytes.len() => {}
                    Ok(written) => {
                        state.unwritten.extend_from_slice(&bytes[written..]);
                        self.shared.unwritten_waiting.notify_one();
                    }
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                        state.unwritten.extend_from_slice(bytes);
                        self.shared.unwritten_waiting.notify_one();
                    }
                    Err(err) => {
                        // Part of it may have left before the failure: the caller cannot tell
                        // that it was not applied, and the error says the connection broke.
                        self.shared.close(&mut state, err.kind());
                        return Err(err.into());
                    }
                }
            } else {
                // Behind bytes still waiting for the socket: the writer sends them in order.
                state.unwritten.extend_from_slice(bytes);
            }
            state.awaiting.push_back(Awaiting {
                replies,
                received: Vec::with_capacity(replies),
                reply_to,
            });
        }
        match tokio::time::timeout(self.shared.response_timeout, reply).await {
            Ok(Ok(replied)) => replied,
            Ok(Err(_)) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the connection closed before the reply",
            )
            .into()),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no reply within the response timeout",
            )
            .into()),
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes the connection for good, failing every command that waits for a reply.
    fn close(&self, state: &mut State, why: io::ErrorKind) {
        if state.closed.is_some() {
            return;
        }
        state.closed = Some(why);
        self.closed.store(true, Ordering::Release);
        state.unwritten = Vec::new();
        for waiting in state.awaiting.drain(..) {
            let lost = io::Error::new(why, "the connection broke before the reply");
            let _ = waiting.reply_to.send(Err(lost.into()));
        }
    }

    /// Hands out every whole reply at the start of `buffer` and removes it from there.
    fn deliver(&self, buffer: &mut Vec<u8>) -> io::Result<()> {
        let mut read = 0;
        let mut state = self.lock();
        while let Some(length) = frame::reply_length(&buffer[read..])? {
            let reply = redis::parse_redis_value(&buffer[read..read + length])
                .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err.to_string()))?;
            read += length;
            let Some(front) = state.awaiting.front_mut() else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a reply to no command",
                ));
            };
            front.received.push(reply);
            if front.received.len() >= front.replies
                && let Some(done) = state.awaiting.pop_front()
            {
                // A command whose caller has gone (cancelled, timed out) is answered to
                // nobody; its place in the order is what mattered.
                let _ = done.reply_to.send(Ok(done.received));
            }
        }
        drop(state);
        buffer.drain(..read);
        Ok(())
    }
}

/// The reader: reads replies and hands each to its command, until the connection closes.
async fn read_replies(shared: Arc<Shared>) {
    let mut buffer = Vec::with_capacity(READ_CHUNK);
    let failure = loop {
        if let Err(err) = shared.socket.readable().await {
            break err.kind();
        }
        buffer.reserve(READ_CHUNK);
        match shared.socket.try_read(&mut buffer) {
            Ok(0) => break io::ErrorKind::UnexpectedEof,
            Ok(_) => {}
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
            Err(err) => break err.kind(),
        }
        if let Err(err) = shared.deliver(&mut buffer) {
            break err.kind();
        }
    };
    shared.close(&mut shared.lock(), failure);
}

/// The writer: writes what the socket did not take from the senders, when it can take more.
async fn write_unwritten(shared: Arc<Shared>) {
    loop {
        shared.unwritten_waiting.notified().await;
        loop {
            if let Err(err) = shared.socket.writable().await {
                shared.close(&mut shared.lock(), err.kind());
                return;
            }
            let mut state = shared.lock();
            if state.unwritten.is_empty() || state.closed.is_some() {
                break;
            }
            match shared.socket.try_write(&state.unwritten) {
                Ok(written) => {
                    state.unwritten.drain(..written);
                    if state.unwritten.is_empty() {
                        break;
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                Err(err) => {
                    shared.close(&mut state, err.kind());
                    return;
                }
            }
        }
    }
}
