//! A TCP proxy for fault tests: forwards every accepted connection to an upstream
//! address, can stall (stop forwarding in both directions) and cut every connection it
//! carries. Moved here from `writer_faults.rs` so the reader's fault tests share it.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP proxy that can stall (stop forwarding in both directions) and cut every
/// connection it carries.
pub struct Proxy {
    pub addr: String,
    paused: watch::Sender<bool>,
    cuts: watch::Sender<u64>,
}

impl Proxy {
    pub async fn bind() -> (Proxy, TcpListener) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (paused, _) = watch::channel(false);
        let (cuts, _) = watch::channel(0);
        (Proxy { addr, paused, cuts }, listener)
    }

    pub fn run(&self, listener: TcpListener, upstream: String) {
        let paused = self.paused.subscribe();
        let cuts = self.cuts.subscribe();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                for (r, w) in [
                    (
                        Box::new(cr) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                        Box::new(sw) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
                    ),
                    (Box::new(sr), Box::new(cw)),
                ] {
                    let paused = paused.clone();
                    let mut cuts = cuts.clone();
                    cuts.mark_unchanged();
                    tokio::spawn(async move {
                        tokio::select! {
                            () = pipe(r, w, paused) => {}
                            _ = cuts.changed() => {}
                        }
                    });
                }
            }
        });
    }

    pub fn pause(&self, on: bool) {
        self.paused.send_replace(on);
    }

    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}

async fn pipe(
    mut r: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    mut w: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    mut paused: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        while *paused.borrow_and_update() {
            if paused.changed().await.is_err() {
                return;
            }
        }
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while *paused.borrow_and_update() {
            if paused.changed().await.is_err() {
                return;
            }
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A broker of its own behind a proxy: (proxy, broker). The broker advertises the proxy's
/// address, so every connection a client makes after bootstrapping from `proxy.addr` —
/// metadata, produce, fetch — goes through the proxy.
pub async fn proxied_broker() -> (Proxy, super::TestBroker) {
    let (proxy, listener) = Proxy::bind().await;
    let addr = proxy.addr.clone();
    let broker = tokio::task::spawn_blocking(move || super::TestBroker::start_advertised(&addr))
        .await
        .unwrap();
    proxy.run(listener, broker.addr.clone());
    (proxy, broker)
}
