//! Release notices: one subscriber connection per backend serves every watched resource.
//!
//! `release.lua` publishes the released fence on the resource's channel. The subscriber task
//! keeps one pub/sub connection, subscribes to each channel the first time a waiter watches
//! it, and wakes that channel's waiters on every message. When the connection is lost it wakes
//! *every* waiter (so none sleeps through a release it could not hear), then reconnects and
//! subscribes again; meanwhile waiters fall back to their timers. Notices are only hints:
//! a missed one costs latency, never safety.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt as _;
use leasehold::ReleaseWatch;
use tokio::sync::{Notify, mpsc};
use tokio_util::task::AbortOnDropHandle;

type Channels = Arc<Mutex<HashMap<String, Arc<Notify>>>>;

struct Running {
    requests: mpsc::UnboundedSender<String>,
    _task: AbortOnDropHandle<()>,
}

pub(crate) struct Notices {
    client: redis::Client,
    connect_timeout: Duration,
    channels: Channels,
    running: Mutex<Option<Running>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Notices {
    pub(crate) fn new(client: redis::Client, connect_timeout: Duration) -> Self {
        Self {
            client,
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
                self.client.clone(),
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

async fn run(
    client: redis::Client,
    connect_timeout: Duration,
    channels: Channels,
    mut requests: mpsc::UnboundedReceiver<String>,
) {
    let mut backoff = Duration::from_millis(20);
    loop {
        if let Ok(Ok(pubsub)) =
            tokio::time::timeout(connect_timeout, client.get_async_pubsub()).await
        {
            let (mut sink, mut stream) = pubsub.split();
            let all: Vec<String> = lock(&channels).keys().cloned().collect();
            let subscribed = all.is_empty() || sink.subscribe(&all).await.is_ok();
            if subscribed {
                backoff = Duration::from_millis(20);
                // Channels asked for while we were away are in `all` already.
                while requests.try_recv().is_ok() {}
                loop {
                    tokio::select! {
                        message = stream.next() => match message {
                            Some(message) => {
                                let notify = lock(&channels).get(message.get_channel_name()).cloned();
                                if let Some(notify) = notify {
                                    notify.notify_waiters();
                                }
                            }
                            None => break,
                        },
                        request = requests.recv() => match request {
                            Some(channel) => {
                                if sink.subscribe(&channel).await.is_err() {
                                    break;
                                }
                            }
                            None => return,
                        },
                    }
                }
            }
            tracing::debug!("release-notice subscriber lost its connection; reconnecting");
        }
        // Whatever was missed while disconnected, waiters must not sleep through it.
        wake_all(&channels);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}
