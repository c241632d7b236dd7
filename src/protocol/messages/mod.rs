//! One module per Kafka API: its request and response, both encodable and decodable for
//! every version this client speaks.
//!
//! | API | versions | flexible from |
//! | --- | --- | --- |
//! | ApiVersions (18) | 0–4 | 3 |

pub mod api_versions;

pub use api_versions::{ApiVersionRange, ApiVersionsRequest, ApiVersionsResponse};
