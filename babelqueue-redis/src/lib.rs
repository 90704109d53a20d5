//! BabelQueue redis backend.
