//! SIGINT/SIGTERM (Ctrl-C elsewhere): the first asks the running command to stop cleanly;
//! a second one exits at once (status 1), for when the clean stop hangs.

use tokio::sync::watch;

/// Whether a stop was asked for.
pub struct Shutdown(watch::Receiver<bool>);

/// The stop requests: SIGTERM and SIGINT.
#[cfg(unix)]
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next request.
    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// The stop requests: Ctrl-C (the handler is installed at the first wait).
#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn install() -> std::io::Result<Signals> {
        Ok(Signals)
    }

    /// The next request.
    async fn next(&mut self) {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Shutdown {
    /// Install the handlers (from now on the signals no longer kill the process).
    pub fn install() -> std::io::Result<Shutdown> {
        let mut signals = Signals::install()?;
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            for n in 0.. {
                signals.next().await;
                if n == 0 {
                    let _ = tx.send(true);
                } else {
                    eprintln!("% second signal: exiting at once");
                    std::process::exit(1);
                }
            }
        });
        Ok(Shutdown(rx))
    }

    /// Resolves once a stop was asked for (at once if it already was). Cancel-safe.
    pub async fn wait(&mut self) {
        if self.0.wait_for(|stop| *stop).await.is_err() {
            // The handler task is gone (the runtime is shutting down): never resolve.
            std::future::pending::<()>().await;
        }
    }

    /// Whether a stop was asked for.
    pub fn requested(&self) -> bool {
        *self.0.borrow()
    }
}
