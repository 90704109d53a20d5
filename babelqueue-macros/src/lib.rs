//! proc macros
