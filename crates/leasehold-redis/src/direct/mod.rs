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
//! A connection is closed for good by the first failure to read or write, or when its reader
//! or writer stops for any reason: every command waiting for a reply then fails as a lost
//! connection (the server may have run it), and a command sent after that is refused
//! unwritten (not applied). [`is_open`] tells the link to make a new connection instead.
//! While a server does not answer, at most [`MAX_AWAITING`] commands wait for replies and
//! [`MAX_UNWRITTEN`] bytes for the socket; beyond that a command is refused unwritten.
//!
//! [`is_open`]: DirectConnection::is_open

mod frame;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::{Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisError, Value};
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;
use tokio::sync::{Notify, oneshot};
use tokio_util::task::AbortOnDropHandle;

use crate::classify::QueryError;

/// How much the reader asks the socket for at a time.
const READ_CHUNK: usize = 16 * 1024;

/// The most commands that may wait for their replies at once. Only a server that stopped
/// answering gets near it: the link's in-flight limit bounds the commands whose callers
/// still wait, and this bounds those whose callers gave up (timed out) as well.
pub(crate) const MAX_AWAITING: usize = 65_536;

/// The most bytes that may wait for the socket behind a command it did not take whole.
pub(crate) const MAX_UNWRITTEN: usize = 64 << 20;

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
    /// Set once the connection is closed (under the lock, so that a sender holding it sees
    /// it settled), and read without the lock by [`DirectConnection::is_open`].
    closed: AtomicBool,
    response_timeout: Duration,
}

/// What the lock guards: the order of the replies and of the bytes still to write.
struct State {
    /// One entry per command written or queued, in the order its bytes were.
    awaiting: VecDeque<Awaiting>,
    /// Commands' bytes the socket has not taken yet, in order, for the writer.
    unwritten: Vec<u8>,
}

/// A command waiting for its replies (one per command it carries: a pipeline has several).
struct Awaiting {
    replies: usize,
    received: Vec<Value>,
    reply_to: oneshot::Sender<Result<Vec<Value>, QueryError>>,
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

    /// Shuts both directions down, so that the server reads nothing more from us even while
    /// clones keep the socket itself open.
    fn shutdown(&self) {
        use redis::io::tcp::socket2::SockRef;
        let _ = match self {
            Socket::Tcp(s) => SockRef::from(s).shutdown(std::net::Shutdown::Both),
            #[cfg(unix)]
            Socket::Unix(s) => SockRef::from(s).shutdown(std::net::Shutdown::Both),
        };
    }
}

impl DirectConnection {
    /// Connects to `info`'s server, authenticates and selects its database as redis-rs
    /// would, and makes one round trip in any case; each reply awaited for at most
    /// `response_timeout`, like every command's after.
    ///
    /// # Errors
    ///
    /// The connection's failure, or the server's refusal, as redis-rs reports them: `AUTH`
    /// as `AuthenticationFailed` (never with the server's text, which may repeat the
    /// password), `SELECT` as a refusal to switch database. A server that refuses the
    /// connection itself (protected mode, `maxclients`) sends one error and closes: the
    /// connect fails by that error or, when it came before our commands' place in the
    /// order, as a lost connection.
    pub(crate) async fn connect(
        info: &ConnectionInfo,
        response_timeout: Duration,
    ) -> redis::RedisResult<Self> {
        let socket = match info.addr() {
            ConnectionAddr::Tcp(host, port) => Socket::Tcp(connect_tcp(host, *port).await?),
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => Socket::Unix(UnixStream::connect(path).await?),
            _ => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "a direct connection is plain TCP or a Unix socket",
                )));
            }
        };
        let connection = Self::over(socket, response_timeout);
        let settings = info.redis_settings();
        let username = settings.username();
        match connection.set_up(settings, username).await? {
            SetUp::Done => {}
            // A server older than Redis 6 knows no users: redis-rs tries the password alone.
            SetUp::RetryWithoutUsername => {
                if let SetUp::RetryWithoutUsername = connection.set_up(settings, None).await? {
                    return Err(auth_failed());
                }
            }
        }
        Ok(connection)
    }

    /// Sends `AUTH` (when there is a password), `SELECT` (when the database is not 0) and
    /// `PING` in one write, and reads their replies.
    async fn set_up(
        &self,
        settings: &redis::RedisConnectionInfo,
        username: Option<&str>,
    ) -> redis::RedisResult<SetUp> {
        let mut setup = redis::pipe();
        let password = settings.password();
        if let Some(password) = password {
            let auth = setup.cmd("AUTH");
            if let Some(username) = username {
                auth.arg(username);
            }
            auth.arg(password);
        }
        if settings.db() != 0 {
            setup.cmd("SELECT").arg(settings.db());
        }
        // Always one round trip: a server that refuses the connection itself sends an error
        // unasked, and it must fail the connect (nothing applied), not the first lease
        // command (which it would leave unknown).
        setup.cmd("PING");
        let replies = self.query_pipeline(&setup).await?;
        if replies.len() != setup.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the connection's setup got too few replies",
            )
            .into());
        }
        let mut replies = replies.into_iter();
        if password.is_some() {
            match replies.next() {
                Some(Value::Okay) => {}
                Some(Value::ServerError(refused))
                    if username.is_some()
                        && refused.details().is_some_and(|d| {
                            d.contains("wrong number of arguments for 'auth'")
                        }) =>
                {
                    return Ok(SetUp::RetryWithoutUsername);
                }
                _ => return Err(auth_failed()),
            }
        }
        if settings.db() != 0
            && let Some(Value::ServerError(refused)) = replies.next()
        {
            // The server's text names the database, never a secret.
            return Err(RedisError::from((
                redis::ServerErrorKind::ResponseError.into(),
                "Redis server refused to switch database",
                refused.details().unwrap_or_default().to_owned(),
            )));
        }
        match replies.next() {
            Some(Value::ServerError(refused)) => Err(refused.into()),
            _ => Ok(SetUp::Done),
        }
    }

    /// A connection over `socket`, with its reader and writer started.
    fn over(socket: Socket, response_timeout: Duration) -> Self {
        let shared = Arc::new(Shared {
            socket,
            state: Mutex::new(State {
                awaiting: VecDeque::new(),
                unwritten: Vec::new(),
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
        !self.shared.is_closed()
    }

    /// Sends one command and returns its reply. An error reply, or one nested in an array,
    /// is an error, as redis-rs's `query_async` makes it.
    ///
    /// # Errors
    ///
    /// `NotWritten` if the connection refused the command unwritten; otherwise the server's
    /// error reply, the connection's failure before the reply, or no reply within the
    /// response timeout.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the command was written leaves it to run: its reply is read
    /// and discarded, and the replies of later commands still go to them.
    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, QueryError> {
        let mut replies = self.send(&cmd.get_packed_command(), 1).await?;
        Ok(replies.pop().unwrap_or(Value::Nil).extract_error()?)
    }

    /// Sends a pipeline's commands in one write and returns every command's reply, in order,
    /// error replies included (as a pipeline with `ignore_errors` would).
    ///
    /// # Errors
    ///
    /// As [`query`](Self::query), but for error replies; a transaction is refused, as a
    /// direct connection does not take `MULTI`/`EXEC` apart.
    ///
    /// # Cancel safety
    ///
    /// As [`query`](Self::query).
    pub(crate) async fn query_pipeline(&self, pipe: &Pipeline) -> Result<Vec<Value>, QueryError> {
        if pipe.is_transaction() {
            return Err(QueryError::Redis(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "a direct connection sends no transactions",
            ))));
        }
        if pipe.is_empty() {
            return Ok(Vec::new());
        }
        self.send(&pipe.get_packed_pipeline(), pipe.len()).await
    }

    async fn send(&self, bytes: &[u8], replies: usize) -> Result<Vec<Value>, QueryError> {
        let (reply_to, reply) = oneshot::channel();
        {
            let mut state = self.shared.lock();
            if self.shared.is_closed() {
                return Err(QueryError::NotWritten("the connection had closed"));
            }
            if state.awaiting.len() >= MAX_AWAITING
                || (!state.unwritten.is_empty()
                    && state.unwritten.len().saturating_add(bytes.len()) > MAX_UNWRITTEN)
            {
                return Err(QueryError::NotWritten(
                    "too many commands wait for a server that does not answer",
                ));
            }
            if state.unwritten.is_empty() {
                let written = match self.shared.socket.try_write(bytes) {
                    Ok(written) => written,
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => 0,
                    Err(err) => {
                        // This write was the command's first, and it wrote nothing.
                        self.shared.close(&mut state, err.kind());
                        return Err(QueryError::NotWritten("the connection broke"));
                    }
                };
                if written < bytes.len() {
                    state.unwritten.extend_from_slice(&bytes[written..]);
                    self.shared.unwritten_waiting.notify_one();
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
            Ok(Err(_)) => Err(lost(io::ErrorKind::ConnectionAborted)),
            Err(_) => Err(QueryError::Redis(
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no reply within the response timeout",
                )
                .into(),
            )),
        }
    }
}

/// What setting a connection up found.
enum SetUp {
    Done,
    /// `AUTH` with a username got "wrong number of arguments": a server without users.
    RetryWithoutUsername,
}

/// redis-rs's error for any refused `AUTH`: the server's own text is not kept, as some
/// servers repeat the arguments (the password) in it.
fn auth_failed() -> RedisError {
    RedisError::from((
        ErrorKind::AuthenticationFailed,
        "Password authentication failed",
    ))
}

/// A command written (or perhaps written) and then lost with the connection.
fn lost(why: io::ErrorKind) -> QueryError {
    QueryError::Redis(io::Error::new(why, "the connection broke before the reply").into())
}

/// Connects to every address `host` names at once, as redis-rs does, and keeps the first
/// that answers: an address that drops packets does not hold up the others.
async fn connect_tcp(host: &str, port: u16) -> io::Result<TcpStream> {
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    if addresses.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "the host name has no address",
        ));
    }
    let tries = addresses
        .into_iter()
        .map(|address| Box::pin(TcpStream::connect(address)));
    let (stream, _) = futures_util::future::select_ok(tries).await?;
    // Each command is written whole, at once: Nagle's algorithm would only hold back the
    // commands of other tasks behind an unacknowledged one.
    stream.set_nodelay(true)?;
    Ok(stream)
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Closes the connection for good: shuts the socket down and fails every command that
    /// waits for a reply, as lost `why`. Later calls change nothing. Takes the lock's guard,
    /// so that no sender writes meanwhile.
    fn close(&self, state: &mut State, why: io::ErrorKind) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.socket.shutdown();
        state.unwritten = Vec::new();
        for waiting in state.awaiting.drain(..) {
            let _ = waiting.reply_to.send(Err(lost(why)));
        }
    }

    /// Hands `replies` out, in order, to the commands waiting for them.
    fn deliver(&self, replies: &mut Vec<Value>) -> io::Result<()> {
        let mut state = self.lock();
        for reply in replies.drain(..) {
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
        Ok(())
    }
}

/// Moves every whole reply at the start of `buffer` into `replies`, parsed.
fn split_replies(buffer: &mut Vec<u8>, replies: &mut Vec<Value>) -> io::Result<()> {
    let mut read = 0;
    while let Some(length) = frame::reply_length(&buffer[read..])? {
        let reply = redis::parse_redis_value(&buffer[read..read + length])
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err.to_string()))?;
        replies.push(reply);
        read += length;
    }
    buffer.drain(..read);
    Ok(())
}

/// Closes the connection when a task of it ends, however it ends: a connection nobody reads
/// or writes for must not look open.
struct CloseOnExit<'a>(&'a Shared);

impl Drop for CloseOnExit<'_> {
    fn drop(&mut self) {
        self.0.close(&mut self.0.lock(), io::ErrorKind::BrokenPipe);
    }
}

/// The reader: reads replies and hands each to its command, until the connection closes.
async fn read_replies(shared: Arc<Shared>) {
    let _closing = CloseOnExit(&shared);
    let mut buffer = Vec::with_capacity(READ_CHUNK);
    let mut replies = Vec::new();
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
        // Parsing needs no lock; only handing the replies out does.
        if let Err(err) = split_replies(&mut buffer, &mut replies) {
            break err.kind();
        }
        if !replies.is_empty()
            && let Err(err) = shared.deliver(&mut replies)
        {
            break err.kind();
        }
    };
    shared.close(&mut shared.lock(), failure);
}

/// The writer: writes what the socket did not take from the senders, when it can take more.
async fn write_unwritten(shared: Arc<Shared>) {
    let _closing = CloseOnExit(&shared);
    loop {
        shared.unwritten_waiting.notified().await;
        loop {
            if let Err(err) = shared.socket.writable().await {
                shared.close(&mut shared.lock(), err.kind());
                return;
            }
            let mut state = shared.lock();
            if state.unwritten.is_empty() || shared.is_closed() {
                break;
            }
            match shared.socket.try_write(&state.unwritten) {
                Ok(0) => {
                    shared.close(&mut state, io::ErrorKind::WriteZero);
                    return;
                }
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
