//! Request metadata keys that nodes and clients agree on. One place, so
//! that no crate has to import another's service module for a constant.

/// Marks a request that must be served where it lands (set on forwarded
/// requests, and by clients that do their own routing): the node answers
/// `NOT_LEADER` with a hint rather than forward it.
pub const FORWARDED_HEADER: &str = "x-fencelock-forwarded";

/// Set by a forwarding node to the address of the client it forwards for:
/// the audit log's `caller`. Its presence also marks the request as counted
/// already (metrics are kept where the client called).
pub const CALLER_HEADER: &str = "x-fencelock-caller";

/// Set by a forwarding node to the client's identity URI. Trusted only
/// from a peer whose certificate is a node's; anyone else sending it is
/// refused.
pub const IDENTITY_HEADER: &str = "x-fencelock-identity";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_valid_lower_case_ascii_metadata_keys() {
        for key in [FORWARDED_HEADER, CALLER_HEADER, IDENTITY_HEADER] {
            assert!(
                key.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "{key}"
            );
            assert!(!key.ends_with("-bin"), "{key} carries text, not binary");
            #[cfg(feature = "grpc")]
            tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(key.as_bytes())
                .unwrap();
        }
    }
}
