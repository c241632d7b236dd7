//! Compression codecs (placeholder).
