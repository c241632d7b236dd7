//! [`Gate`]: holds requests back until a test lets them through ([`Fault::Hold`]), so a
//! test orders "the request is in flight" before "what happens meanwhile" by readiness
//! instead of by a delay.
//!
//! [`Fault::Hold`]: super::Fault::Hold

use std::sync::Arc;

use tokio::sync::Semaphore;

/// Lets requests held by [`Fault::Hold`](super::Fault::Hold) through: each
/// [`release`](Gate::release) lets one held request (or the next one to arrive) be
/// handled. Clones share the gate.
///
/// ```
/// use kafkapipe::mock::{Fault, Gate, MockCluster};
/// use kafkapipe::protocol::ApiKey;
/// # fn main() -> kafkapipe::Result<()> {
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let cluster = MockCluster::builder().topic("t", 1).start().await?;
/// let gate = Gate::new();
/// // The next Produce is answered only after `gate.release(1)`.
/// cluster.fault(ApiKey::PRODUCE, Fault::Hold(gate.clone()), 1);
/// gate.release(1);
/// # Ok(()) })
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Gate(Arc<Semaphore>);

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Gate(Arc::new(Semaphore::new(0)))
    }

    /// Let `n` more held requests through.
    pub fn release(&self, n: usize) {
        self.0.add_permits(n);
    }

    /// Wait until the gate lets one request through.
    pub(crate) async fn pass(&self) {
        if let Ok(permit) = self.0.acquire().await {
            permit.forget();
        }
    }
}

impl Default for Gate {
    /// A closed gate.
    fn default() -> Self {
        Gate::new()
    }
}

impl PartialEq for Gate {
    /// The same gate (clones of one another).
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Gate {}
