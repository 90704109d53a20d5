//! BabelQueue postgres backend.
