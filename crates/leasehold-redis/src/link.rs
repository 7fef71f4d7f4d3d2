//! One multiplexed connection, made lazily and remade after it breaks, and the EVALSHA path.
//!
//! The connection is owned here rather than by redis-rs's `ConnectionManager` because the two
//! failure cases must be told apart, and only this layer knows which one happened: a command
//! that never found a connection was definitely not sent (`Unavailable`), while one handed to a
//! connection that then failed may have run (`Indeterminate`).
//!
//! On a cluster the connection is redis-rs's cluster connection (one multiplexed connection per
//! node, commands routed by their key's slot), built with *no retries*: it would otherwise
//! resend a command after a dropped connection, and a release resent after it had applied
//! would come back "absent" — a second answer that hides the first. A redirect (`MOVED`,
//! `ASK`) is therefore returned to us, as `Unavailable`, and the client's slot map is refreshed
//! for the next try.
//!
//! Behind Sentinel the connection goes to the master the Sentinels name at connect time; a
//! lost connection, a `READONLY` reply (a demoted master) or a response timeout (a stalled
//! one) drops it, so the next command asks the Sentinels again. And since a replaced master
//! keeps answering until it is demoted, every command's answer is checked against the master
//! the Sentinels name while it runs (`sentinels.rs`): one that came from another is not
//! trusted, and the command is sent again to the named master.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold::{Failure, IndeterminateCause, Unavailable, UnavailableCause};
use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, Cmd, RedisResult, Value};
use tokio::sync::Semaphore;

use crate::classify::{self, Classified, QueryError};
use crate::direct::{self, DirectConnection};
use crate::scripts::{LeaseScript, ScriptCall};
use crate::sentinels::{MasterAddr, Sentinels};
use crate::settings::{ReplicationGate, Transport};
use crate::telemetry::InFlight;

/// Makes connections: to one server, or to a cluster.
#[derive(Clone)]
pub(crate) enum Connector {
    /// A standalone server.
    Single {
        client: redis::Client,
        config: AsyncConnectionConfig,
        /// How long a command waits for its reply (`config` holds it too, for redis-rs).
        response_timeout: Duration,
        transport: Transport,
    },
    /// A cluster, from its seed nodes.
    Cluster(ClusterClient),
    /// The master a set of Sentinels names, asked again for every new connection.
    Sentinel {
        sentinel: Arc<tokio::sync::Mutex<SentinelClient>>,
        /// The same Sentinels, asked which master they name beside every command.
        sentinels: Arc<Sentinels>,
        config: AsyncConnectionConfig,
        /// As for [`Connector::Single`].
        response_timeout: Duration,
        transport: Transport,
    },
}

impl Connector {
    /// Makes a connection, and says which master it reached when Sentinels named it.
    async fn connect(&self) -> Result<(Connection, Option<Arc<MasterAddr>>), Unavailable> {
        let failed = |err: redis::RedisError| classify::connect_failure(&err);
        match self {
            Connector::Single {
                client,
                config,
                response_timeout,
                transport,
            } => one_server(client, config, *response_timeout, *transport)
                .await
                .map(|connection| (connection, None))
                .map_err(failed),
            Connector::Cluster(client) => client
                .get_async_connection()
                .await
                .map(|connection| (Connection::Cluster(connection), None))
                .map_err(failed),
            Connector::Sentinel {
                sentinel,
                sentinels,
                config,
                response_timeout,
                transport,
            } => {
                // redis-rs asks the Sentinels for the master and checks with ROLE that the
                // node agrees; it reads `SENTINEL MASTERS`, which names the promoted replica
                // only once a failover ends. The commands are checked against the master that
                // `GET-MASTER-ADDR-BY-NAME` names, which changes as soon as one is promoted:
                // the connection goes there, with redis-rs's credentials, database and TLS.
                let (client, named) = tokio::join!(
                    async { sentinel.lock().await.async_get_client().await },
                    sentinels.named()
                );
                let (client, named) = (client.map_err(failed)?, named?);
                let client =
                    if MasterAddr::of(client.get_connection_info()).as_ref() == Some(&named) {
                        client
                    } else {
                        redis::Client::open(named.applied_to(client.get_connection_info()))
                            .map_err(failed)?
                    };
                one_server(&client, config, *response_timeout, *transport)
                    .await
                    .map(|connection| (connection, Some(Arc::new(named))))
                    .map_err(failed)
            }
        }
    }

    /// Returns true if and only if the connection should be dropped after `failure`, so that
    /// the next command connects afresh. A lost connection always; a `READONLY` reply always
    /// (we are talking to a replica: a demoted master, or a node an operator re-pointed); and
    /// a response timeout when the target is discovered (Sentinel), since the master may have
    /// been replaced while this one stalls — on a standalone server a new connection would go
    /// to the same stalled process, and the cluster client tracks its nodes itself.
    fn drops_connection_after(&self, failure: &Classified) -> bool {
        match failure {
            Classified::Indeterminate(i) => {
                i.cause == IndeterminateCause::ConnectionLost
                    || (i.cause == IndeterminateCause::ResponseTimeout
                        && matches!(self, Connector::Sentinel { .. }))
            }
            Classified::NotApplied(u) => u.cause == UnavailableCause::ReadOnly,
            Classified::NoScript => false,
        }
    }
}

/// Connects to one server: directly where `transport` asks for it and a [`DirectConnection`]
/// can (plain TCP or a Unix socket, RESP2), through redis-rs's multiplexed connection
/// otherwise (TLS, RESP3).
async fn one_server(
    client: &redis::Client,
    config: &AsyncConnectionConfig,
    response_timeout: Duration,
    transport: Transport,
) -> RedisResult<Connection> {
    let info = client.get_connection_info();
    if transport == Transport::Direct && direct::supports(info) {
        return DirectConnection::connect(info, response_timeout)
            .await
            .map(Connection::Direct);
    }
    client
        .get_multiplexed_async_connection_with_config(config)
        .await
        .map(Connection::Single)
}

/// A live connection of any kind; each multiplexes concurrent commands.
#[derive(Clone)]
enum Connection {
    /// Commands written by their senders (D49).
    Direct(DirectConnection),
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Connection {
    /// Sends `cmd`; an error reply is an error.
    async fn query(&mut self, cmd: &Cmd) -> Result<Value, QueryError> {
        match self {
            Connection::Direct(c) => c.query(cmd).await,
            Connection::Single(c) => Ok(cmd.query_async(c).await?),
            Connection::Cluster(c) => Ok(cmd.query_async(c).await?),
        }
    }

    /// Sends `pipe` (which ignores errors: each reply is returned as it came).
    async fn query_pipeline(&mut self, pipe: &redis::Pipeline) -> Result<Vec<Value>, QueryError> {
        match self {
            Connection::Direct(c) => c.query_pipeline(pipe).await,
            Connection::Single(c) => Ok(pipe.query_async(c).await?),
            Connection::Cluster(c) => Ok(pipe.query_async(c).await?),
        }
    }

    /// Returns false if and only if the connection is known to have closed, so that nothing
    /// sent on it would be written. Only a direct connection knows; the others find out when
    /// a command fails.
    fn is_open(&self) -> bool {
        match self {
            Connection::Direct(c) => c.is_open(),
            Connection::Single(_) | Connection::Cluster(_) => true,
        }
    }
}

/// A command that ran on a master the Sentinels no longer name, and could not be confirmed on
/// the one they name.
fn master_replaced(detail: &str) -> Failure {
    Failure::Indeterminate(leasehold::Indeterminate::new(
        IndeterminateCause::MasterReplaced,
        format!("the command ran on a replaced master: {detail}"),
    ))
}

/// A command that ran while no Sentinel could say which master is the one.
fn master_unconfirmed(why: &Unavailable) -> Failure {
    Failure::Indeterminate(leasehold::Indeterminate::new(
        IndeterminateCause::MasterUnconfirmed,
        format!("the Sentinels did not confirm the master: {}", why.detail),
    ))
}

/// Turns an error reply into an error.
fn server_error(value: Value) -> RedisResult<Value> {
    match value {
        Value::ServerError(err) => Err(redis::RedisError::from(err)),
        other => Ok(other),
    }
}

/// The connects a link has tried, and how the last one failed.
#[derive(Default)]
struct Tried {
    count: u64,
    failed: Option<Unavailable>,
}

/// A connection and its generation, so that only the broken one is forgotten.
#[derive(Clone)]
struct Current {
    generation: u64,
    connection: Connection,
    /// The master it reached, as the Sentinels named it (Sentinel deployments only).
    master: Option<Arc<MasterAddr>>,
    /// The term of that master (see [`Masters`]).
    term: u64,
}

/// The last master a connection reached, and its *term*: how many times a connection has
/// reached another master than the one before (a failover). A grant carries the term of the
/// connection that answered its acquire, so that a renewal that finds it gone on a master of
/// a later term knows the replacement lost it. Always 0 off Sentinel.
#[derive(Default)]
struct Masters {
    last: Option<Arc<MasterAddr>>,
    term: u64,
}

impl Masters {
    /// Records that a connection reached `master`; returns its term.
    fn reached(&mut self, master: Option<&Arc<MasterAddr>>) -> u64 {
        if let Some(master) = master {
            if self.last.as_ref().is_some_and(|last| last != master) {
                self.term += 1;
            }
            self.last = Some(Arc::clone(master));
        }
        self.term
    }
}

pub(crate) struct Link {
    connector: Connector,
    /// Host and port, for diagnostics (never credentials).
    endpoint: String,
    /// Set once the first connection has looked at the server's eviction policy.
    eviction_checked: AtomicBool,
    connect_timeout: Duration,
    current: Mutex<Option<Current>>,
    generation: Mutex<u64>,
    /// How many connects have been tried, and how the last one failed, if it did: a command
    /// that waited while one was tried takes its answer rather than trying again in turn.
    tried: Mutex<Tried>,
    masters: Mutex<Masters>,
    reconnect: tokio::sync::Mutex<()>,
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
}

impl Link {
    pub(crate) fn new(
        connector: Connector,
        endpoint: String,
        connect_timeout: Duration,
        max_in_flight: usize,
    ) -> Self {
        Self {
            connector,
            endpoint,
            eviction_checked: AtomicBool::new(false),
            connect_timeout,
            current: Mutex::new(None),
            generation: Mutex::new(0),
            tried: Mutex::new(Tried::default()),
            masters: Mutex::new(Masters::default()),
            reconnect: tokio::sync::Mutex::new(()),
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
        }
    }

    /// The current connection, unless it is known to have closed: nothing sent on that one
    /// would be written, so the caller connects again instead (its command has not been sent,
    /// and a new connection is what the next one would have made anyway).
    fn cached(&self) -> Option<Current> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|current| current.connection.is_open())
            .cloned()
    }

    fn tried(&self) -> std::sync::MutexGuard<'_, Tried> {
        self.tried.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns the live connection, making one if there is none, within the connect timeout
    /// from the call: the time spent waiting for another command's connect counts.
    async fn connection(&self) -> Result<Current, Unavailable> {
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let timed_out = || {
            Unavailable::new(
                UnavailableCause::ConnectTimeout,
                format!("no connection within {:?}", self.connect_timeout),
            )
        };
        // One connect at a time; the others wait for it and take its answer.
        let seen = self.tried().count;
        let Ok(_reconnecting) = tokio::time::timeout_at(deadline, self.reconnect.lock()).await
        else {
            return Err(timed_out());
        };
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        {
            let tried = self.tried();
            if tried.count != seen {
                // A connect was tried while this command waited: it failed, or its connection
                // has closed already (a server that accepts and then drops us). Trying again
                // at once would only repeat that for every waiter in turn, each after the
                // last, far past the timeout each was given.
                return Err(tried.failed.clone().unwrap_or_else(|| {
                    Unavailable::new(
                        UnavailableCause::NotConnected,
                        "the connection made while this command waited closed at once",
                    )
                }));
            }
        }
        let connected = match tokio::time::timeout_at(deadline, self.connector.connect()).await {
            Ok(connected) => connected,
            Err(_) => Err(timed_out()),
        };
        {
            let mut tried = self.tried();
            tried.count += 1;
            tried.failed = connected.as_ref().err().cloned();
        }
        let (connection, master) = connected?;
        if !self.eviction_checked.swap(true, Ordering::Relaxed) {
            // Once per backend, on its first connection: a policy that can evict leases is
            // worth a warning before the first lease, not after the first loss.
            let mut probe = connection.clone();
            let query = async move {
                let mut cmd = redis::cmd("CONFIG");
                cmd.arg("GET").arg("maxmemory-policy").arg("maxmemory");
                Ok(probe.query(&cmd).await?)
            };
            crate::eviction::check(query, self.connect_timeout, &self.endpoint).await;
        }
        let generation = {
            let mut g = self
                .generation
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *g += 1;
            *g
        };
        let term = self
            .masters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reached(master.as_ref());
        let current = Current {
            generation,
            connection,
            master,
            term,
        };
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(current.clone());
        Ok(current)
    }

    /// Returns true if and only if a command of this link is in flight.
    pub(crate) fn busy(&self) -> bool {
        self.in_flight.available_permits() < self.max_in_flight
    }

    /// Makes sure there is a live connection, so that a command built next goes out at once.
    pub(crate) async fn ready(&self) -> Result<(), Failure> {
        self.connection()
            .await
            .map(|_| ())
            .map_err(Failure::Unavailable)
    }

    /// Forgets the connection of `generation` if it is still the current one, so that the
    /// next command makes a new connection (and learns whether the server is reachable).
    /// Returns true if and only if it was the current one.
    fn forget(&self, generation: u64) -> bool {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let forgotten = current.as_ref().is_some_and(|c| c.generation == generation);
        if forgotten {
            *current = None;
        }
        forgotten
    }

    /// Sends one command on `current`'s connection (a clone the caller owns, so that nothing is
    /// cloned again per command), classifying any failure.
    async fn send(&self, current: &mut Current, cmd: &Cmd) -> Result<Value, Classified> {
        let result = current.connection.query(cmd).await;
        result.map_err(|err| self.classify(current, &err))
    }

    /// Sends a script command, followed on the same connection by `WAIT` when `gate` asks for
    /// replicas. Returns the script's reply and, when gated, how many replicas confirmed it.
    async fn send_script(
        &self,
        current: &mut Current,
        evalsha: &Cmd,
        gate: Option<ReplicationGate>,
    ) -> Result<(Value, Option<u32>), Classified> {
        let Some(gate) = gate else {
            return self.send(current, evalsha).await.map(|v| (v, None));
        };
        // One pipeline on one connection: WAIT counts the replicas that acknowledged every
        // write this connection made before it, the script's included.
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .add_command(evalsha.clone())
            .cmd("WAIT")
            .arg(gate.replicas())
            .arg(u64::try_from(gate.timeout().as_millis()).unwrap_or(u64::MAX));
        let result = current
            .connection
            .query_pipeline(&pipe)
            .await
            .and_then(|replies| {
                let mut replies = replies.into_iter();
                let reply = server_error(replies.next().unwrap_or(Value::Nil))?;
                // A WAIT that failed (say, refused on a replica) confirmed nothing; the script's
                // reply stands and the gate decides what it means.
                let confirmed = match replies.next() {
                    Some(Value::Int(n)) => u32::try_from(n).unwrap_or(0),
                    _ => 0,
                };
                Ok((reply, Some(confirmed)))
            });
        result.map_err(|err| self.classify(current, &err))
    }

    /// Classifies a failed send, dropping the connection when that failure calls for it.
    fn classify(&self, current: &Current, err: &QueryError) -> Classified {
        let classified = classify::after_query(err);
        if self.connector.drops_connection_after(&classified) {
            self.forget(current.generation);
        }
        classified
    }

    /// Runs `call` by EVALSHA, then `WAIT` when `gate` is given. On NOSCRIPT only, loads the
    /// script and retries once: NOSCRIPT proves it did not run. Returns the reply and, when
    /// gated, the number of replicas that confirmed it.
    ///
    /// After warm-up this is exactly one round trip.
    pub(crate) async fn eval<C: ScriptCall>(
        &self,
        call: &C,
        gate: Option<ReplicationGate>,
    ) -> Result<(Value, Option<u32>), Failure> {
        self.eval_in_term(call, gate)
            .await
            .map(|(value, confirmed, _)| (value, confirmed))
    }

    /// [`eval`](Self::eval), with the term of the master that answered (see [`Masters`]).
    pub(crate) async fn eval_in_term<C: ScriptCall>(
        &self,
        call: &C,
        gate: Option<ReplicationGate>,
    ) -> Result<(Value, Option<u32>, u64), Failure> {
        let started = traced();
        let replied = self.eval_sha(call, gate).await;
        trace_command("EVALSHA", C::script().name, started, replied.as_ref().err());
        replied
    }

    /// [`eval_in_term`](Self::eval_in_term), untraced.
    async fn eval_sha<C: ScriptCall>(
        &self,
        call: &C,
        gate: Option<ReplicationGate>,
    ) -> Result<(Value, Option<u32>, u64), Failure> {
        // The in-flight limit is checked before anything else, so Overloaded never sends.
        let _permit = self
            .in_flight
            .try_acquire()
            .map_err(|_| Failure::Overloaded)?;
        let _counted = InFlight::start();
        let mut current = self.connection().await.map_err(Failure::Unavailable)?;
        let term = current.term;
        let in_term = |(value, confirmed)| (value, confirmed, term);
        let Connector::Sentinel { sentinels, .. } = &self.connector else {
            return self.eval_on(&mut current, call, gate).await.map(in_term);
        };
        let (replied, named) =
            tokio::join!(self.eval_on(&mut current, call, gate), sentinels.named());
        // A failure is the command's own answer, whichever master it met.
        let replied = replied?;
        let named = named.map_err(|u| master_unconfirmed(&u))?;
        if current.master.as_deref() == Some(&named) {
            return Ok(in_term(replied));
        }
        // It ran on a master the Sentinels no longer name: a replaced one, which answers until
        // it is demoted and whose writes the new master never sees. Its answer says nothing of
        // the master that now decides. The command goes again to the named one, whose answer
        // stands: every lease command can be sent twice for the same attempt (an acquire
        // replays, a renewal or release acts on the exact grant).
        let was = current
            .master
            .as_deref()
            .map_or_else(String::new, ToString::to_string);
        if self.forget(current.generation) {
            // Once per replaced connection, by the command that found it out; the others in
            // flight on it say so at debug level.
            tracing::warn!(%was, %named, "the master was replaced: commands go to the named one");
        } else {
            tracing::debug!(%was, %named, "ran on a replaced master: sent again");
        }
        let mut current = self
            .connection()
            .await
            .map_err(|u| master_replaced(&u.detail))?;
        let (replied, again) =
            tokio::join!(self.eval_on(&mut current, call, gate), sentinels.named());
        let (value, confirmed) = replied?;
        match again {
            Ok(again) if current.master.as_deref() == Some(&again) => {
                Ok((value, confirmed, current.term))
            }
            Ok(again) => {
                let _ = self.forget(current.generation);
                Err(master_replaced(&format!("the Sentinels now name {again}")))
            }
            Err(u) => Err(master_unconfirmed(&u)),
        }
    }

    /// Runs `call` on `current` by EVALSHA (then `WAIT` when `gate` is given), loading the
    /// script and sending it again once after a NOSCRIPT.
    async fn eval_on<C: ScriptCall>(
        &self,
        current: &mut Current,
        call: &C,
        gate: Option<ReplicationGate>,
    ) -> Result<(Value, Option<u32>), Failure> {
        let script = C::script();
        let evalsha = call.evalsha();
        match self.send_script(current, &evalsha, gate).await {
            Err(Classified::NoScript) => {}
            replied => return replied.map_err(Failure::from),
        }
        tracing::debug!(script = script.name, "NOSCRIPT: loading the script again");
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(script.source);
        if let Err(failed) = self.send(current, &load).await {
            // The lease command has not run: the first EVALSHA was refused with NOSCRIPT and
            // the second was never sent. Whatever went wrong with the load, nothing applied.
            let detail = match failed {
                Classified::NotApplied(u) => u.detail,
                Classified::Indeterminate(i) => i.detail,
                Classified::NoScript => "NOSCRIPT on SCRIPT LOAD".to_owned(),
            };
            return Err(Failure::Unavailable(Unavailable::new(
                UnavailableCause::ScriptMissing,
                format!("loading the {} script failed: {detail}", script.name),
            )));
        }
        match self.send_script(current, &evalsha, gate).await {
            Err(Classified::NoScript) => Err(Failure::Unavailable(Unavailable::new(
                UnavailableCause::ScriptMissing,
                format!(
                    "the {} script was missing right after loading it",
                    script.name
                ),
            ))),
            replied => replied.map_err(Failure::from),
        }
    }

    /// Runs `call` by `EVAL` with its script's whole source, never by SHA: for a command that
    /// must work even when nobody will be there to answer a NOSCRIPT (the cleanup sent behind
    /// an unanswered acquire, which a stalled server may only run after the client has gone).
    /// One round trip, no retry.
    pub(crate) async fn eval_source<C: ScriptCall>(&self, call: &C) -> Result<Value, Failure> {
        let started = traced();
        let replied = self.eval_whole(call).await;
        trace_command("EVAL", C::script().name, started, replied.as_ref().err());
        replied
    }

    /// [`eval_source`](Self::eval_source), untraced.
    async fn eval_whole<C: ScriptCall>(&self, call: &C) -> Result<Value, Failure> {
        let _permit = self
            .in_flight
            .try_acquire()
            .map_err(|_| Failure::Overloaded)?;
        let _counted = InFlight::start();
        let mut current = self.connection().await.map_err(Failure::Unavailable)?;
        let script = C::script();
        let eval = call.eval();
        match self.send(&mut current, &eval).await {
            // EVAL carries its source: NOSCRIPT cannot come back, and if it did, nothing ran.
            Err(Classified::NoScript) => Err(Failure::Unavailable(Unavailable::new(
                UnavailableCause::ScriptMissing,
                format!("NOSCRIPT for EVAL of the {} script", script.name),
            ))),
            sent => sent.map_err(Failure::from),
        }
    }

    /// Returns the string keys that match `pattern`, by `SCAN` (never `KEYS`, which would
    /// block the server while it walks the whole key space), on every master of a Cluster.
    /// A key that exists for the whole scan is returned at least once (SCAN's guarantee);
    /// one written or deleted meanwhile may or may not be. Bounded: each node's walk stops
    /// after [`MAX_SCAN_ROUNDS`] rounds, reported as unavailable rather than as a short list.
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>, Failure> {
        let current = self.connection().await.map_err(Failure::Unavailable)?;
        let scanned = match &current.connection {
            Connection::Cluster(connection) => scan_cluster(pattern, connection.clone()).await,
            one_server => {
                scan_node(pattern, |cmd| {
                    let mut connection = one_server.clone();
                    async move { connection.query(&cmd).await }
                })
                .await
            }
        };
        scanned.map_err(|err| match err {
            ScanError::Query(err) => Failure::from(self.classify(&current, &err)),
            ScanError::Unbounded => Failure::Unavailable(Unavailable::new(
                UnavailableCause::NotConnected,
                format!("SCAN did not finish within {MAX_SCAN_ROUNDS} rounds"),
            )),
            ScanError::Unreadable(what) => Failure::Indeterminate(leasehold::Indeterminate::new(
                IndeterminateCause::UnexpectedReply,
                format!("unreadable {what} reply"),
            )),
        })
    }

    /// Connects and loads `scripts`, so that later commands are one round trip each.
    pub(crate) async fn load(&self, scripts: &[&LeaseScript]) -> Result<(), Failure> {
        let mut current = self.connection().await.map_err(Failure::Unavailable)?;
        for script in scripts {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(script.source);
            self.send(&mut current, &load)
                .await
                .map_err(Failure::from)?;
        }
        Ok(())
    }
}

/// The most SCAN rounds one node's walk may take (1,000 keys a round: ten million keys).
const MAX_SCAN_ROUNDS: usize = 10_000;

/// Why a scan did not finish.
enum ScanError {
    Query(QueryError),
    Unbounded,
    Unreadable(&'static str),
}

impl From<QueryError> for ScanError {
    fn from(err: QueryError) -> Self {
        ScanError::Query(err)
    }
}

impl From<redis::RedisError> for ScanError {
    fn from(err: redis::RedisError) -> Self {
        ScanError::Query(QueryError::Redis(err))
    }
}

/// Walks one node's key space with `SCAN cursor MATCH pattern COUNT 1000 TYPE string`,
/// sending each round through `send`.
async fn scan_node<F, Fut>(pattern: &str, send: F) -> Result<Vec<String>, ScanError>
where
    F: Fn(Cmd) -> Fut,
    Fut: std::future::Future<Output = Result<Value, QueryError>>,
{
    let mut keys = Vec::new();
    let mut cursor = "0".to_owned();
    for _ in 0..MAX_SCAN_ROUNDS {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(&cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .arg("TYPE")
            .arg("string");
        let reply = send(cmd).await?;
        let Value::Array(mut parts) = reply else {
            return Err(ScanError::Unreadable("SCAN"));
        };
        let (Some(Value::Array(found)), Some(next)) = (parts.pop(), parts.pop()) else {
            return Err(ScanError::Unreadable("SCAN"));
        };
        for key in found {
            match key {
                Value::BulkString(bytes) => {
                    // A key that is not UTF-8 is not one of ours: every lease key is ASCII.
                    if let Ok(key) = String::from_utf8(bytes) {
                        keys.push(key);
                    }
                }
                _ => return Err(ScanError::Unreadable("SCAN")),
            }
        }
        cursor = match next {
            Value::BulkString(bytes) => {
                String::from_utf8(bytes).map_err(|_| ScanError::Unreadable("SCAN"))?
            }
            _ => return Err(ScanError::Unreadable("SCAN")),
        };
        if cursor == "0" {
            return Ok(keys);
        }
    }
    Err(ScanError::Unbounded)
}

/// Scans every master of a Cluster (found with `CLUSTER SLOTS`), each by its address.
async fn scan_cluster(
    pattern: &str,
    connection: ClusterConnection,
) -> Result<Vec<String>, ScanError> {
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    let mut probe = connection.clone();
    let slots = probe
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .and_then(server_error)?;
    let masters = cluster_masters(&slots).ok_or(ScanError::Unreadable("CLUSTER SLOTS"))?;
    let mut keys = Vec::new();
    for (host, port) in masters {
        let found = scan_node(pattern, |cmd| {
            let mut connection = connection.clone();
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port,
            });
            async move {
                let reply = connection.route_command(cmd, routing).await?;
                Ok(server_error(reply)?)
            }
        })
        .await?;
        keys.extend(found);
    }
    Ok(keys)
}

/// The masters' addresses in a `CLUSTER SLOTS` reply (each range's first node), once each.
fn cluster_masters(slots: &Value) -> Option<Vec<(String, u16)>> {
    let Value::Array(ranges) = slots else {
        return None;
    };
    let mut masters: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(range) = range else {
            return None;
        };
        let Some(Value::Array(node)) = range.get(2) else {
            return None;
        };
        let host = match node.first() {
            Some(Value::BulkString(host)) => String::from_utf8(host.clone()).ok()?,
            _ => return None,
        };
        let port = match node.get(1) {
            Some(Value::Int(port)) => u16::try_from(*port).ok()?,
            _ => return None,
        };
        if !masters.iter().any(|(h, p)| *h == host && *p == port) {
            masters.push((host, port));
        }
    }
    Some(masters)
}

/// When a command starts, if its `trace` event will be logged: the clock is read only then, as
/// the hot path would otherwise read it twice per command for nothing.
fn traced() -> Option<std::time::Instant> {
    tracing::enabled!(tracing::Level::TRACE).then(std::time::Instant::now)
}

/// A `trace` event per lease command: the command, the script, the latency and how it failed,
/// if it did (the kind and cause only: a reply's text is not logged).
fn trace_command(
    command: &str,
    script: &str,
    started: Option<std::time::Instant>,
    failed: Option<&Failure>,
) {
    let Some(started) = started else {
        return;
    };
    let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    match failed {
        None => tracing::trace!(command, script, us, "replied"),
        Some(Failure::Indeterminate(i)) => {
            tracing::trace!(command, script, us, cause = ?i.cause, "outcome unknown");
        }
        Some(Failure::Unavailable(u)) => {
            tracing::trace!(command, script, us, cause = ?u.cause, "not applied");
        }
        Some(_) => tracing::trace!(command, script, us, "not sent: too many in flight"),
    }
}

#[cfg(test)]
mod tests {
    use test_support::RedisServer;

    use super::*;

    #[test]
    fn a_connection_to_another_master_than_the_last_starts_a_term() {
        let mut masters = Masters::default();
        let at = |port| Arc::new(MasterAddr::at("127.0.0.1", port));
        // Off Sentinel no connection names a master: always term 0.
        assert_eq!(masters.reached(None), 0);
        assert_eq!(masters.reached(Some(&at(7000))), 0);
        // Reconnecting to the same master keeps the term; another one starts the next.
        assert_eq!(masters.reached(Some(&at(7000))), 0);
        assert_eq!(masters.reached(Some(&at(7001))), 1);
        assert_eq!(masters.reached(None), 1);
        assert_eq!(masters.reached(Some(&at(7000))), 2);
    }

    fn link_to(server: &RedisServer) -> Link {
        let timeout = Duration::from_secs(5);
        let connector = Connector::Single {
            client: redis::Client::open(server.url()).unwrap(),
            config: AsyncConnectionConfig::new().set_response_timeout(Some(timeout)),
            response_timeout: timeout,
            transport: Transport::Direct,
        };
        Link::new(connector, server.addr().to_string(), timeout, 16)
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_is_replaced_before_the_next_command() {
        let server = RedisServer::start();
        let link = link_to(&server);
        link.load(&crate::scripts::all()).await.unwrap();
        let first = link.cached().expect("connected").generation;
        server.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
        // The reader hears the close at once; until it does, a command would still meet the
        // old connection (and be unknown, as it always was).
        crate::testing::eventually("the close heard", Duration::from_secs(10), || {
            link.cached().is_none()
        })
        .await;
        // Nothing was sent on the closed connection: the next command makes a new one and is
        // answered, where it used to fail as unknown.
        link.load(&crate::scripts::all()).await.unwrap();
        assert_eq!(link.cached().expect("connected").generation, first + 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commands_that_waited_for_a_connection_that_closed_at_once_do_not_reconnect_in_turn() {
        use std::sync::atomic::AtomicUsize;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // A server that answers the connect's PING slowly and then drops the connection.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&accepted);
        let server = tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut asked = Vec::new();
                    while !asked.ends_with(b"PING\r\n") {
                        let mut byte = [0; 1];
                        if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        asked.push(byte[0]);
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let _ = socket.write_all(b"+PONG\r\n").await;
                });
            }
        });
        let timeout = Duration::from_secs(5);
        let link = Arc::new(Link::new(
            Connector::Single {
                client: redis::Client::open(format!("redis://{addr}")).unwrap(),
                config: AsyncConnectionConfig::new(),
                response_timeout: timeout,
                transport: Transport::Direct,
            },
            addr.to_string(),
            timeout,
            16,
        ));
        let callers: Vec<_> = (0..8)
            .map(|_| {
                let link = Arc::clone(&link);
                tokio::spawn(async move { link.ready().await })
            })
            .collect();
        for caller in callers {
            // Each is answered: by the connection, or as not connected.
            if let Err(failure) = caller.await.unwrap() {
                assert!(
                    matches!(&failure, Failure::Unavailable(u) if u.cause == UnavailableCause::NotConnected),
                    "{failure:?}"
                );
            }
        }
        // One connection for all eight, not one after another for each.
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        server.abort();
    }

    #[tokio::test]
    async fn a_plain_tcp_server_gets_a_direct_connection() {
        let server = RedisServer::start();
        let link = link_to(&server);
        link.ready().await.unwrap();
        assert!(matches!(
            link.cached().expect("connected").connection,
            Connection::Direct(_)
        ));
    }
}
