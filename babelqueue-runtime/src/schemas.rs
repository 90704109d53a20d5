//! The `App` half of payload schemas (feature `schema`, see [`babelqueue_core::schema`]): the
//! producer's refusal of invalid data and the consumer's opt-in safety net. The schemas
//! themselves know nothing of the runtime.

use std::sync::Arc;

use super::app::App;
use babelqueue_core::envelope::Envelope;
use babelqueue_core::schema::{SchemaError, Schemas};

/// Producer-side checks: the `App` half of payload schemas. Only the field
/// `App::schemas`, its initialisation and the one call in [`App::publish`](crate::App::publish) live in
/// `runtime/app.rs`.
impl App {
    /// Validates every payload [`publish`](Self::publish) sends against its URN's schema
    /// (a URN without one is not checked): data that breaks it is refused with
    /// [`PublishError::Schema`](crate::PublishError::Schema) naming the path and
    /// the rule, and nothing is published. [`publish_envelope`](Self::publish_envelope) and
    /// [`publish_raw`](Self::publish_raw) send what they are given unchecked (call
    /// [`Schemas::check`] first).
    ///
    /// The same value can serve the consumer side: the runtime's opt-in dead-letter of an
    /// invalid payload calls [`Schemas::check`] on each decoded envelope.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use babelqueue_runtime::{App, InMemoryTransport, PublishError};
    /// use babelqueue_core::schema::{InMemoryProvider, Schemas};
    /// use serde_json::json;
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let schemas = Schemas::new(InMemoryProvider::new().with(
    ///     "urn:babel:orders:created",
    ///     json!({"type": "object", "required": ["order_id"]}),
    /// ));
    /// let transport = InMemoryTransport::new();
    /// let app = App::new(transport.clone()).queue("orders").schemas(Arc::new(schemas));
    ///
    /// app.publish("urn:babel:orders:created", &json!({"order_id": 7})).await?;
    /// let err = app.publish("urn:babel:orders:created", &json!({"id": 7})).await.unwrap_err();
    /// assert!(matches!(err, PublishError::Schema(_)));
    /// assert_eq!(transport.len("orders"), 1);
    /// # Ok::<(), PublishError>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn schemas(mut self, schemas: Arc<Schemas>) -> Self {
        self.schemas = Some(schemas);
        self
    }

    /// Also checks every consumed payload against the schemas of
    /// [`schemas`](Self::schemas) (opt-in; off by default): a payload that breaks its URN's
    /// schema is dead-lettered at once as `failed`, the violation (path and rule) in
    /// `dead_letter.error`, since a retry cannot fix it; the handler does not run. A
    /// schema that cannot be loaded fails the delivery like a handler error (retried). A
    /// URN without a schema is not checked.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use babelqueue_runtime::{App, InMemoryTransport};
    /// use babelqueue_core::schema::{InMemoryProvider, Schemas};
    /// use babelqueue_core::Envelope;
    /// use serde_json::json;
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let schemas = Schemas::new(InMemoryProvider::new().with(
    ///     "urn:babel:orders:created",
    ///     json!({"type": "object", "required": ["order_id"]}),
    /// ));
    /// let transport = InMemoryTransport::new();
    /// let app = App::new(transport.clone())
    ///     .queue("orders")
    ///     .schemas(Arc::new(schemas))
    ///     .validate_on_consume(true)
    ///     .route_sync("urn:babel:orders:created", |_env: &Envelope| ());
    /// // Another producer sent data without `order_id`.
    /// let bad = Envelope::new("urn:babel:orders:created", json!({"id": 7}))?;
    /// app.publish_envelope(&bad).await?;
    /// let stats = app.drain().await?;
    /// assert_eq!((stats.succeeded, stats.dead_lettered), (0, 1));
    /// let dead = transport.messages("orders.dlq");
    /// assert!(String::from_utf8_lossy(&dead[0]).contains("breaks `required`"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn validate_on_consume(mut self, on: bool) -> Self {
        self.config.validate_on_consume = on;
        self
    }

    /// The payload schemas set with [`schemas`](Self::schemas).
    pub fn payload_schemas(&self) -> Option<&Arc<Schemas>> {
        self.schemas.as_ref()
    }

    pub(crate) fn check_schema(&self, envelope: &Envelope) -> Result<(), SchemaError> {
        match &self.schemas {
            Some(schemas) => schemas.check(envelope),
            None => Ok(()),
        }
    }
}
