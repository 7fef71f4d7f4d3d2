//! Leader election across three processes: the leader does fenced work, is killed (SIGKILL:
//! nothing released), and another candidate takes over within the TTL; a write under the dead
//! leader's term is then refused as stale.
//!
//! `cargo run -p leasehold-redis --example election` against `$LEASEHOLD_REDIS_URL` (default
//! `redis://127.0.0.1:6379`). It starts itself three times as `election candidate <n>`.

use std::process::Stdio;
use std::time::Duration;

use leasehold_redis::leasehold::{FenceToken, HolderName};
use leasehold_redis::{FencedWrite, RecordName, RedisBackend, RedisLeases, RedisSettings};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const ELECTION: &str = "scheduler";
/// The record the leader writes, fenced by its term.
const RECORD: &str = "schedule";

fn connect() -> Res<RedisLeases> {
    let url = std::env::var("LEASEHOLD_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into());
    Ok(RedisBackend::open(&url, RedisSettings::default())?.into_client())
}

/// The fenced work: the store takes a write only from a term at least as new as its last.
async fn write(client: &RedisLeases, record: &RecordName, term: FenceToken) -> FencedWrite {
    let election = client.election(ELECTION);
    let value = format!("planned under term {term}");
    let (purpose, resource) = (election.purpose(), election.resource());
    client
        .backend()
        .fenced_write(purpose, resource, record, term, value.as_bytes())
        .await
}

/// One candidate's process: leads whenever it can, until its stdin closes.
async fn candidate(n: u32) -> Res<()> {
    let (client, record) = (&connect()?, &RecordName::new(RECORD)?);
    let stop = async {
        let _ = tokio::io::stdin().read(&mut [0u8; 1]).await;
    };
    // The election code: 10 lines, besides the work.
    let me = client
        .election(ELECTION)
        .with_ttl(Duration::from_secs(1))
        .candidate(HolderName::new(&format!("candidate-{n}"))?);
    me.run_until(stop, |term| async move {
        println!("candidate {n} leads term {}", term.fence());
        loop {
            let written = write(client, record, term.fence()).await;
            println!(
                "candidate {n} wrote under term {}: {written:?}",
                term.fence()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await?;
    Ok(())
}

/// Waits for the next line from any candidate that satisfies `wanted`.
async fn next_line(
    lines: &mut mpsc::UnboundedReceiver<String>,
    wanted: impl Fn(&str) -> bool,
) -> Res<String> {
    let wait = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.recv().await {
            println!("  | {line}");
            if wanted(&line) {
                return Some(line);
            }
        }
        None
    });
    Ok(wait.await?.ok_or("the candidates are gone")?)
}

/// `candidate <n> leads term <t>` → (n, t).
fn leads(line: &str) -> Option<(u32, u64)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words[..] {
        ["candidate", n, "leads", "term", t] => Some((n.parse().ok()?, t.parse().ok()?)),
        _ => None,
    }
}

async fn supervise() -> Res<()> {
    let (tx, mut lines) = mpsc::unbounded_channel();
    let mut children: Vec<Child> = Vec::new();
    for n in 1..=3 {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["candidate", &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut out = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = out.next_line().await {
                let _ = tx.send(line);
            }
        });
        children.push(child);
    }
    let first = next_line(&mut lines, |l| leads(l).is_some()).await?;
    let (leader, old_term) = leads(&first).ok_or("a leader")?;
    next_line(&mut lines, |l| {
        l.contains("wrote under") && l.ends_with("Written")
    })
    .await?;
    next_line(&mut lines, |l| {
        l.contains("wrote under") && l.ends_with("Written")
    })
    .await?;
    let killed = &mut children[leader as usize - 1];
    killed.kill().await?;
    println!("killed candidate {leader} (term {old_term}): nothing released");
    let started = tokio::time::Instant::now();
    let next = next_line(&mut lines, |l| leads(l).is_some_and(|(n, _)| n != leader)).await?;
    let (successor, new_term) = leads(&next).ok_or("a successor")?;
    println!(
        "candidate {successor} took over as term {new_term} after {:?}",
        started.elapsed()
    );
    next_line(&mut lines, |l| {
        l.contains("wrote under") && l.ends_with("Written")
    })
    .await?;
    let old = FenceToken::new(old_term).ok_or("a term")?;
    let stale = write(&connect()?, &RecordName::new(RECORD)?, old).await;
    println!("a write under the dead leader's term {old_term} now: {stale:?}");
    // Closing their stdin stops the others: the leader resigns on the way out.
    for child in &mut children {
        drop(child.stdin.take());
    }
    for (i, child) in children.iter_mut().enumerate() {
        if i + 1 != leader as usize {
            let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await??;
            println!("candidate {} stopped: {status}", i + 1);
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match &args[..] {
        [role, n] if role == "candidate" => candidate(n.parse()?).await,
        _ => supervise().await,
    }
}
