//! Release notices: one subscriber connection per backend serves every watched resource.
//!
//! `release.lua` publishes the released fence on the resource's channel when someone was
//! refused the grant (a waiter's try, or an observer's read, marked it: D48). The subscriber task
//! keeps one pub/sub connection, subscribes to each channel the first time a waiter watches
//! it, and wakes that channel's waiters on every message. When the connection is lost it wakes
//! *every* waiter (so none sleeps through a release it could not hear), then reconnects and
//! subscribes again; meanwhile waiters fall back to their timers. Notices are only hints:
//! a missed one costs latency, never safety.
//!
//! A channel is kept only while someone watches it: every [`SWEEP_EVERY`] the task drops the
//! channels whose every watch is gone and unsubscribes from them, so that a process that has
//! waited on a million resources over its life holds subscriptions only for those with
//! waiters now.
//!
//! On a standalone server this is classic `SUBSCRIBE` (the script uses `PUBLISH`). On a cluster
//! it is sharded pub/sub: the script uses `SPUBLISH`, which stays on the node that owns the
//! channel's slot (the lease's slot), and the subscriber is a RESP3 cluster connection whose
//! `SSUBSCRIBE`s are routed to that node. That connection holds one link per node it needs;
//! when one drops, redis-rs reconnects it and subscribes again, and tells us (a
//! `Disconnection` push) so that waiters are woken here too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::stream::{self, BoxStream, StreamExt as _};
use leasehold::backend::ReleaseWatch;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{ConnectionInfo, PushKind, RedisResult, Value};
use tokio::sync::{Notify, mpsc};
use tokio_util::task::AbortOnDropHandle;

type Channels = Arc<Mutex<HashMap<String, Arc<Notify>>>>;

/// How often the subscriber drops the channels no one watches any more.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(1);

struct Running {
    requests: mpsc::UnboundedSender<String>,
    _task: AbortOnDropHandle<()>,
}

/// Where the subscriber connects.
#[derive(Clone)]
pub(crate) enum Source {
    /// A standalone server: classic pub/sub.
    Single(Box<redis::Client>),
    /// A cluster's seed nodes, and the TLS roots to trust for them: sharded pub/sub.
    Cluster {
        seeds: Vec<ConnectionInfo>,
        roots: Option<Vec<u8>>,
    },
    /// The master the Sentinels name at each (re)connection: classic pub/sub.
    Sentinel(Arc<tokio::sync::Mutex<SentinelClient>>),
}

pub(crate) struct Notices {
    source: Source,
    connect_timeout: Duration,
    channels: Channels,
    running: Mutex<Option<Running>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Notices {
    pub(crate) fn new(source: Source, connect_timeout: Duration) -> Self {
        Self {
            source,
            connect_timeout,
            channels: Arc::default(),
            running: Mutex::new(None),
        }
    }

    /// Returns a watch on `channel`, subscribing to it if no one watched it before.
    pub(crate) fn watch(&self, channel: String) -> ReleaseWatch {
        let (notify, new) = {
            let mut channels = lock(&self.channels);
            match channels.get(&channel) {
                Some(n) => (Arc::clone(n), false),
                None => {
                    let n = Arc::new(Notify::new());
                    channels.insert(channel.clone(), Arc::clone(&n));
                    (n, true)
                }
            }
        };
        if new {
            self.subscribe(channel);
        }
        ReleaseWatch::new(notify)
    }

    fn subscribe(&self, channel: String) {
        let mut running = lock(&self.running);
        if running.is_none() {
            // Outside a runtime there is no task to run the subscriber; waiters use timers.
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return;
            };
            let (requests, rx) = mpsc::unbounded_channel();
            let task = runtime.spawn(run(
                self.source.clone(),
                self.connect_timeout,
                Arc::clone(&self.channels),
                rx,
            ));
            *running = Some(Running {
                requests,
                _task: AbortOnDropHandle::new(task),
            });
        }
        if let Some(running) = running.as_ref() {
            // A closed channel means the task ended; the next reconnect is not coming, but
            // waiters still have their timers.
            let _ = running.requests.send(channel);
        }
    }
}

fn wake_all(channels: &Channels) {
    for notify in lock(channels).values() {
        notify.notify_waiters();
    }
}

fn wake(channels: &Channels, channel: &str) {
    let notify = lock(channels).get(channel).cloned();
    if let Some(notify) = notify {
        notify.notify_waiters();
    }
}

/// Removes from `channels` every channel that no watch holds any more (the map's own handle
/// is the only one left) and returns them, to unsubscribe. A watch taken after this finds no
/// entry and subscribes anew; one taken before keeps the entry.
fn take_idle(channels: &Channels) -> Vec<String> {
    let mut channels = lock(channels);
    let idle: Vec<String> = channels
        .iter()
        .filter(|(_, notify)| Arc::strong_count(notify) == 1)
        .map(|(channel, _)| channel.clone())
        .collect();
    for channel in &idle {
        channels.remove(channel);
    }
    idle
}

/// What a subscriber connection delivers.
enum Event {
    /// A release was published on this channel.
    Released(String),
    /// One of the connection's links dropped; redis-rs reconnects it and subscribes again.
    Disconnected,
}

/// The subscribing half of a subscriber connection.
enum Subscriber {
    Single(redis::aio::PubSubSink),
    Cluster(ClusterConnection),
}

impl Subscriber {
    async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Subscriber::Single(sink) => sink.subscribe(channel).await,
            Subscriber::Cluster(connection) => connection.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channels: &[String]) -> RedisResult<()> {
        match self {
            Subscriber::Single(sink) => sink.unsubscribe(channels).await,
            Subscriber::Cluster(connection) => {
                for channel in channels {
                    connection.sunsubscribe(channel).await?;
                }
                Ok(())
            }
        }
    }
}

/// Connects to `source`, returning the subscribing half and the stream of events.
async fn connect(
    source: &Source,
    connect_timeout: Duration,
) -> RedisResult<(Subscriber, BoxStream<'static, Event>)> {
    let classic = |pubsub: redis::aio::PubSub| {
        let (sink, messages) = pubsub.split();
        let events = messages
            .map(|message| Event::Released(message.get_channel_name().to_owned()))
            .boxed();
        (Subscriber::Single(sink), events)
    };
    match source {
        Source::Single(client) => Ok(classic(client.get_async_pubsub().await?)),
        Source::Sentinel(sentinel) => {
            // A failover closes connections to the old master, so this runs again and finds
            // the new one.
            let client = sentinel.lock().await.async_get_client().await?;
            Ok(classic(client.get_async_pubsub().await?))
        }
        Source::Cluster { seeds, roots } => {
            let (tx, mut rx) = mpsc::unbounded_channel();
            let client = crate::clients::cluster_builder(seeds.clone(), roots.as_deref())
                .connection_timeout(connect_timeout)
                .response_timeout(connect_timeout)
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(tx)
                .build()?;
            let connection = client.get_async_connection().await?;
            let events = stream::poll_fn(move |cx| rx.poll_recv(cx))
                .filter_map(|push: redis::PushInfo| async move {
                    match push.kind {
                        PushKind::SMessage => match push.data.first() {
                            Some(Value::BulkString(name)) => {
                                Some(Event::Released(String::from_utf8_lossy(name).into_owned()))
                            }
                            _ => None,
                        },
                        PushKind::Disconnection => Some(Event::Disconnected),
                        _ => None,
                    }
                })
                .boxed();
            Ok((Subscriber::Cluster(connection), events))
        }
    }
}

/// Subscribes to `channels`: in one command on a standalone server, one command each on a
/// cluster, where channels of different slots cannot share an `SSUBSCRIBE`.
async fn subscribe_all(subscriber: &mut Subscriber, channels: &[String]) -> RedisResult<()> {
    match subscriber {
        Subscriber::Single(sink) if !channels.is_empty() => sink.subscribe(channels).await,
        Subscriber::Single(_) => Ok(()),
        Subscriber::Cluster(connection) => {
            for channel in channels {
                connection.ssubscribe(channel).await?;
            }
            Ok(())
        }
    }
}

async fn run(
    source: Source,
    connect_timeout: Duration,
    channels: Channels,
    mut requests: mpsc::UnboundedReceiver<String>,
) {
    let mut backoff = Duration::from_millis(20);
    loop {
        if let Ok(Ok((mut subscriber, mut events))) =
            tokio::time::timeout(connect_timeout, connect(&source, connect_timeout)).await
        {
            let all: Vec<String> = lock(&channels).keys().cloned().collect();
            if subscribe_all(&mut subscriber, &all).await.is_ok() {
                backoff = Duration::from_millis(20);
                // A release published before a subscription was in place went unheard:
                // every waiter tries once more now that it is.
                wake_all(&channels);
                // Requests queued while we were away are served by the loop below. Most name a
                // channel `all` had already (subscribing again is harmless); one whose watch
                // came after `all` was read would otherwise never be subscribed.
                let mut sweep = tokio::time::interval(SWEEP_EVERY);
                sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = sweep.tick() => {
                            let idle = take_idle(&channels);
                            if !idle.is_empty() && subscriber.unsubscribe(&idle).await.is_err() {
                                break;
                            }
                        }
                        event = events.next() => match event {
                            Some(Event::Released(channel)) => wake(&channels, &channel),
                            // A release may have gone unheard while the link was down.
                            Some(Event::Disconnected) => wake_all(&channels),
                            None => break,
                        },
                        request = requests.recv() => match request {
                            // Its watches may all be gone already (and the channel swept):
                            // subscribing then would leave a subscription no sweep removes.
                            Some(channel) if !lock(&channels).contains_key(&channel) => {}
                            Some(channel) => {
                                if subscriber.subscribe(&channel).await.is_err() {
                                    break;
                                }
                                // The watch was handed out before this; a release in between
                                // went unheard.
                                wake(&channels, &channel);
                            }
                            None => return,
                        },
                    }
                }
            }
            tracing::debug!("release-notice subscriber lost its connection; reconnecting");
            crate::telemetry::notice_reconnect();
        }
        // Whatever was missed while disconnected, waiters must not sleep through it.
        wake_all(&channels);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}
