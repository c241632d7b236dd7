//! Record batches (placeholder).
