//! How a node stops with what it hosts: at `gpux node stop --end-leases` every hosted lease
//! ends and settles; at any other stop (SIGTERM, Ctrl-C, `gpux node stop`) the leases keep
//! running for the node's next start, which takes them up (docs/execution.md, "Restarts and
//! upgrades keep leases running").

use std::time::Duration;

use tokio::sync::mpsc;

use super::{Daemon, Event, SHUTDOWN_SETTLE, host};

impl Daemon {
    /// At a shutdown with `end_leases`: every hosted lease ends (HostShutdown) and settles,
    /// within a bound.
    pub(super) async fn stop_hosting(&mut self, events_rx: &mut mpsc::Receiver<Event>) {
        let Some(host) = self.host.as_mut() else {
            return;
        };
        host.shutdown_all();
        self.host_events_while(events_rx, host::HostRole::busy)
            .await;
    }

    /// At any other shutdown: the hosted leases keep running. Only leases between their lock
    /// and their start are waited for (within a bound): the next start cannot take those up
    /// (the renter's start request dies with this process), so they are let reach their
    /// start. Every record is on disk (flushed as it changed); the containers, their
    /// workspaces and their usage go on without the node, which takes them up again at its
    /// next start (`HostRole::recover`).
    pub(super) async fn detach_hosting(&mut self, events_rx: &mut mpsc::Receiver<Event>) {
        let Some(host) = self.host.as_ref() else {
            return;
        };
        let running = host.open_count();
        self.host_events_while(events_rx, host::HostRole::starting)
            .await;
        if running > 0 {
            tracing::info!(
                "{running} hosted lease(s) keep running: the node's next start on this data \
                 directory takes them up again (`gpux node stop --end-leases` ends them)"
            );
        }
    }

    /// Handles host events until `pending` is false for the host role, at most
    /// [`SHUTDOWN_SETTLE`].
    async fn host_events_while(
        &mut self,
        events_rx: &mut mpsc::Receiver<Event>,
        pending: fn(&host::HostRole) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + SHUTDOWN_SETTLE;
        // Leases move by events; workers end (their erasures done) without one: looked at
        // every 100 ms.
        let mut recheck = tokio::time::interval(Duration::from_millis(100));
        while self.host.as_ref().is_some_and(pending) {
            tokio::select! {
                _ = recheck.tick() => {}
                () = tokio::time::sleep_until(deadline) => {
                    let open = self.host.as_ref().map_or(0, |h| h.open_count());
                    tracing::warn!("{open} lease(s) still moving at shutdown; they resume at the next start");
                    break;
                }
                Some(event) = events_rx.recv() => {
                    if let Event::Host { .. } = event {
                        self.on_event(event);
                    }
                }
            }
        }
    }
}
