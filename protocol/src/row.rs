//! The rows a gate writes: a [`Check`] with its [`Status`], metrics, message and
//! [`FirstMismatch`], and the [`DoorsRow`], each with its exact JSON form.
//!
//! It owns the shape of a row only; appending rows to the checks file is `write`'s job and
//! reading them back (leniently, as older gates wrote them) is `read`'s.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The status of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    /// Reported but not a failure: the gate wants a reader to look.
    Warn,
    /// The check could not run here (no GPU, say); not a failure.
    Skip,
}

impl Status {
    /// The wire spelling: `pass`, `fail`, `warn` or `skip`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Warn => "warn",
            Status::Skip => "skip",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The first value that differed: at decode `step` (absent for prompt programs), batch or
/// program `row`, vocabulary `index`, the reference's and the candidate's values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FirstMismatch {
    pub step: Option<usize>,
    pub row: usize,
    pub index: usize,
    pub reference: f64,
    pub got: f64,
}

impl FirstMismatch {
    /// `{"step":…,"row":…,"index":…,"ref":…,"got":…}`, `step` only when there is one. JSON
    /// has no NaN or infinity, so such values are written as text (`"NaN"`, `"inf"`) and the
    /// row stays valid.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        if let Some(step) = self.step {
            m.insert("step".into(), json!(step));
        }
        m.insert("row".into(), json!(self.row));
        m.insert("index".into(), json!(self.index));
        m.insert("ref".into(), finite_or_text(self.reference));
        m.insert("got".into(), finite_or_text(self.got));
        Value::Object(m)
    }

    /// Reads the form [`FirstMismatch::to_json`] writes (text values parsed back to
    /// floats); `None` for any other shape, which a reader keeps as plain JSON.
    pub fn from_json(value: &Value) -> Option<FirstMismatch> {
        let obj = value.as_object()?;
        let index = |k: &str| obj.get(k).and_then(Value::as_u64).map(|v| v as usize);
        let float = |k: &str| match obj.get(k)? {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        };
        let step = match obj.get("step") {
            None => None,
            Some(_) => Some(index("step")?),
        };
        Some(FirstMismatch {
            step,
            row: index("row")?,
            index: index("index")?,
            reference: float("ref")?,
            got: float("got")?,
        })
    }
}

impl std::fmt::Display for FirstMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(step) = self.step {
            write!(f, "step {step}, ")?;
        }
        write!(
            f,
            "row {}, index {}: ref {} got {}",
            self.row, self.index, self.reference, self.got
        )
    }
}

fn finite_or_text(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        json!(v.to_string())
    }
}

/// One check row as a gate writes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// The check's name, unique within the gate (`gate2[B=4]`).
    pub name: String,
    pub status: Status,
    /// Numbers or short strings a receipt should show, written in insertion order.
    pub metrics: Map<String, Value>,
    /// What was checked or why it failed, in words; may be empty.
    pub message: String,
    pub first_mismatch: Option<FirstMismatch>,
}

impl Check {
    pub fn new(name: impl Into<String>, status: Status, message: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status,
            metrics: Map::new(),
            message: message.into(),
            first_mismatch: None,
        }
    }

    /// Adds (or replaces) one metric.
    pub fn metric(mut self, key: &str, value: impl Into<Value>) -> Check {
        self.metrics.insert(key.to_string(), value.into());
        self
    }

    /// The row: `check`, `status`, `metrics` and `message` always, in that order, then
    /// `first_mismatch` when there is one.
    pub fn to_json(&self) -> Value {
        let mut row = json!({
            "check": self.name,
            "status": self.status.as_str(),
            "metrics": self.metrics,
            "message": self.message,
        });
        if let Some(m) = &self.first_mismatch {
            row["first_mismatch"] = m.to_json();
        }
        row
    }
}

/// The doors row: which code paths the gate actually ran, as a flat object of strings,
/// numbers and booleans (`{"doors":{"backend":"cuda","pp_stages":2}}`), so a pin that
/// silently did nothing shows in the receipt. Keys keep their insertion order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DoorsRow {
    pub values: Map<String, Value>,
}

impl DoorsRow {
    pub fn new() -> DoorsRow {
        DoorsRow::default()
    }

    /// Adds (or replaces) one door. The value must be a string, a number or a boolean;
    /// [`DoorsRow::problem`] says whether one is not.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> DoorsRow {
        self.insert(key, value);
        self
    }

    /// Adds (or replaces) one door, in place.
    pub fn insert(&mut self, key: &str, value: impl Into<Value>) {
        self.values.insert(key.to_string(), value.into());
    }

    /// Why this row breaks the protocol (a nested or null value), in the words the reader
    /// reports; `None` when it is flat.
    pub fn problem(&self) -> Option<String> {
        flat_problem(&self.values)
    }

    /// `{"doors":{…}}`.
    pub fn to_json(&self) -> Value {
        json!({ "doors": self.values })
    }
}

impl From<Map<String, Value>> for DoorsRow {
    fn from(values: Map<String, Value>) -> DoorsRow {
        DoorsRow { values }
    }
}

/// The first value of a doors object that is not a string, number or boolean.
pub(crate) fn flat_problem(doors: &Map<String, Value>) -> Option<String> {
    doors
        .iter()
        .find(|(_, v)| v.is_object() || v.is_array() || v.is_null())
        .map(|(k, v)| {
            format!(
                "doors.{k} is {v}; door values must be strings, numbers or booleans (a flat object)"
            )
        })
}
