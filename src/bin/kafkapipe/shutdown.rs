//! SIGINT/SIGTERM: the first asks the running command to stop cleanly; a second one
//! exits at once (status 1), for when the clean stop hangs.

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// Whether a stop was asked for.
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// Install the handlers (from now on the signals no longer kill the process).
    pub fn install() -> std::io::Result<Shutdown> {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            for n in 0.. {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
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
