//! `babelqueue dlq redrive`: the library's [`redrive`] over the broker's own transport
//! (Redis lists or RabbitMQ), printed as a table or as JSON.

use babelqueue_runtime::Transport;
use babelqueue_runtime::redrive::{RedriveItem, RedriveOptions, RedriveResult, redrive};

use crate::CliError;

/// What the command was asked.
pub(crate) struct Request {
    pub dlq: String,
    pub to: Option<String>,
    pub max: usize,
    pub dry_run: bool,
    pub reasons: Vec<String>,
    pub urns: Vec<String>,
    pub bypass: bool,
    pub json: bool,
}

impl Request {
    fn options(&self) -> RedriveOptions {
        let mut o = RedriveOptions::new()
            .max(self.max)
            .dry_run(self.dry_run)
            .bypass(self.bypass);
        if let Some(to) = &self.to {
            o = o.to(to.clone());
        }
        for r in &self.reasons {
            o = o.reason(r.clone());
        }
        for u in &self.urns {
            o = o.urn(u.clone());
        }
        o
    }
}

/// Runs the redrive and prints it; an error after a partial run prints what was done first.
pub(crate) async fn run<T: Transport>(transport: &T, req: &Request) -> Result<(), CliError> {
    run_with(transport, req, req.options()).await
}

/// [`run`] with the options given (a selection the command line cannot say).
pub(crate) async fn run_with<T: Transport>(
    transport: &T,
    req: &Request,
    options: RedriveOptions,
) -> Result<(), CliError> {
    match redrive(transport, &req.dlq, &options).await {
        Ok(result) => {
            print(&result, req);
            Ok(())
        }
        Err(e) => {
            print(e.result(), req);
            Err(CliError::Message(chain_text(&e)))
        }
    }
}

pub(crate) fn chain_text(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cur = c.source();
    }
    text
}

fn print(result: &RedriveResult, req: &Request) {
    if req.json {
        println!("{}", result.to_json());
    } else {
        print!("{}", table(result, &req.dlq));
    }
}

fn short(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(n.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// The result as a table: one row per message, then a summary line.
pub(crate) fn table(result: &RedriveResult, dlq: &str) -> String {
    let header = [
        "META ID", "TRACE ID", "URN", "REASON", "TO", "STATUS", "BYPASS",
    ];
    let rows: Vec<[String; 7]> = result
        .items
        .iter()
        .map(|i: &RedriveItem| {
            [
                short(&i.message_id, 36),
                short(&i.trace_id, 36),
                short(&i.urn, 40),
                i.reason.clone(),
                i.to.clone().unwrap_or_else(|| "-".into()),
                i.status.to_string(),
                if i.bypassed { "yes" } else { "no" }.into(),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.push('\n');
        s
    };
    let mut out = String::new();
    if result.dry_run {
        out.push_str(&format!(
            "DRY RUN on {dlq}: nothing changed; the plan for {} message(s):\n",
            result.items.len()
        ));
    }
    if !rows.is_empty() {
        out.push_str(&line(&header.map(str::to_owned)));
        for r in &rows {
            out.push_str(&line(r));
        }
    }
    let bypassed = result.items.iter().filter(|i| i.bypassed).count();
    out.push_str(&format!(
        "{dlq}: {} taken, {} redriven ({bypassed} with bq-replay-bypass), {} restored to the DLQ\n",
        result.items.len(),
        result.redriven,
        result.restored,
    ));
    out
}
