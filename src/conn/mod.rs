//! Broker connections (placeholder).
