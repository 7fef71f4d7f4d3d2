//! A fault-injecting TCP proxy on loopback: put it between a client and a redis-server and
//! decide, per direction, whether bytes pass, are held back, or make the proxy reset the
//! connection — the ways a request or a reply is lost on a real network.
//!
//! Faults act on bytes as they arrive, so a test can let a request through and lose its reply
//! (`to_client = Reset`: the server applied the command, the client sees a dropped connection),
//! or lose the request itself (`to_server = Reset`: nothing reached the server).

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

/// What the proxy does with bytes travelling in one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyFault {
    /// Forward them.
    Pass,
    /// Keep them (unread, unforwarded) until the direction passes again: the peer waits.
    Hold,
    /// Drop the connection (both sides) instead of forwarding them.
    Reset,
}

#[derive(Debug)]
struct Faults {
    to_server: Mutex<ProxyFault>,
    to_client: Mutex<ProxyFault>,
    stopped: AtomicBool,
}

impl Faults {
    fn get(&self, to_server: bool) -> ProxyFault {
        let cell = if to_server {
            &self.to_server
        } else {
            &self.to_client
        };
        *cell.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A proxy listening on a free loopback port, forwarding to one upstream address. Stops
/// accepting and closes its connections when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    faults: Arc<Faults>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream`, passing everything.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound.
    pub fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a loopback port");
        let addr = listener.local_addr().expect("a bound address");
        let faults = Arc::new(Faults {
            to_server: Mutex::new(ProxyFault::Pass),
            to_client: Mutex::new(ProxyFault::Pass),
            stopped: AtomicBool::new(false),
        });
        let shared = Arc::clone(&faults);
        thread::spawn(move || accept(&listener, upstream, &shared));
        Self { addr, faults }
    }

    /// Returns `redis://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Returns the proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets what happens to bytes from the client to the server.
    pub fn to_server(&self, fault: ProxyFault) {
        *self
            .faults
            .to_server
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = fault;
    }

    /// Sets what happens to bytes from the server to the client.
    pub fn to_client(&self, fault: ProxyFault) {
        *self
            .faults
            .to_client
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = fault;
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.faults.stopped.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
    }
}

fn accept(listener: &TcpListener, upstream: SocketAddr, faults: &Arc<Faults>) {
    for client in listener.incoming() {
        if faults.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(1)) else {
            // Upstream down: the client sees its connection closed, as with a dead server.
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        let up = Arc::clone(faults);
        let down = Arc::clone(faults);
        thread::spawn(move || pump(client, server, true, &up));
        thread::spawn(move || pump(server2, client2, false, &down));
    }
}

/// Moves bytes `from` → `to` under the direction's fault until either side closes.
fn pump(mut from: TcpStream, mut to: TcpStream, to_server: bool, faults: &Faults) {
    // Short reads so that a held direction notices when it is released, and a stopped proxy
    // when it is dropped.
    let _ = from.set_read_timeout(Some(Duration::from_millis(5)));
    let mut buf = [0u8; 16 * 1024];
    loop {
        if faults.stopped.load(Ordering::SeqCst) {
            break;
        }
        if faults.get(to_server) == ProxyFault::Hold {
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        // The fault in force when the bytes arrived decides their fate.
        match faults.get(to_server) {
            ProxyFault::Pass => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            ProxyFault::Reset => break,
            ProxyFault::Hold => {
                // Held from here on: keep these bytes and deliver them when released.
                while faults.get(to_server) == ProxyFault::Hold
                    && !faults.stopped.load(Ordering::SeqCst)
                {
                    thread::sleep(Duration::from_millis(5));
                }
                if faults.get(to_server) == ProxyFault::Reset || to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
