//! The Prometheus HTTP API v1 client: one query, its envelope checked,
//! its body bounded, its answer decoded into series.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde::de::IgnoredAny;

use super::plan::Planned;
use crate::http::Tls;
use crate::{SignalError, excerpt};

/// Queries in flight at once against Prometheus.
pub const MAX_PARALLEL_QUERIES: usize = 4;
/// Largest API response read.
const MAX_BODY_BYTES: usize = 32 << 20;

/// A query that failed. The Display text is what lands in the stage's
/// `signal_errors`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueryError {
    /// Prometheus answered with `"status":"error"`.
    #[error("prometheus: {error_type}: {error} (HTTP {status})")]
    Api {
        status: u16,
        error_type: String,
        error: String,
    },
    /// A non-2xx answer that is not an API envelope (a proxy's page).
    #[error("prometheus: HTTP {status} with a non-API body: {excerpt}")]
    Http { status: u16, excerpt: String },
    /// A 2xx answer that is not the expected JSON.
    #[error("prometheus: malformed response ({why}); body starts: {excerpt}")]
    Malformed { why: String, excerpt: String },
    #[error("prometheus: no answer within {0} (the query timeout)")]
    Timeout(String),
    #[error("prometheus: request to {url} failed: {why}")]
    Transport { url: String, why: String },
    /// A sample value that is NaN or infinite where a number was expected.
    #[error("prometheus returned a non-finite value {0}")]
    NonFinite(String),
    /// A counter's increase or rate below zero: the store mishandles
    /// counter resets (read as 0, recorded as this fault).
    #[error(
        "prometheus answered a negative counter increase ({0}): the store mishandles counter resets; read as 0"
    )]
    NegativeIncrease(f64),
    /// A series of a range query with more points than Prometheus itself
    /// ever answers: the store ignored the query's step.
    #[error(
        "prometheus answered a series of {points} points, more than the {MAX_POINTS_PER_SERIES} a range query can have (the store ignored the query's step); read none of it"
    )]
    TooManyPoints { points: usize },
    /// Not sent: an earlier query of the same check got no answer in time,
    /// so this one would most likely only wait out the same timeout.
    #[error(
        "prometheus: not queried: an earlier query of this check got no answer within {0} (the query timeout)"
    )]
    NotQueried(String),
}

/// One series of a query result: its labels and points (unix seconds, value).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub points: Vec<(f64, f64)>,
}

/// The API envelope, its `data` skipped: read first, so that an error
/// answer is reported as such whatever its `data` holds.
#[derive(Deserialize)]
struct Envelope {
    status: String,
    #[serde(default)]
    data: Option<IgnoredAny>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    warnings: Vec<String>,
}

/// The `data` of a successful answer.
#[derive(Deserialize)]
struct Answer {
    data: Data,
}

#[derive(Deserialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
enum Data {
    Matrix(Vec<MatrixItem>),
    Vector(Vec<VectorItem>),
    Scalar((f64, String)),
}

#[derive(Deserialize)]
struct VectorItem {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

#[derive(Deserialize)]
struct MatrixItem {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    values: BoundedPoints,
}

/// Most points of one series a range query can answer: Prometheus refuses
/// queries that would give more (its "maximum resolution"). The queries
/// here ask for about 200.
pub const MAX_POINTS_PER_SERIES: usize = 11_000;

/// A series' `[time, "value"]` points: at most [`MAX_POINTS_PER_SERIES`]
/// are kept (the rest are skipped unparsed), `total` counts them all.
struct BoundedPoints {
    kept: Vec<(f64, String)>,
    total: usize,
}

impl<'de> Deserialize<'de> for BoundedPoints {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Points;
        impl<'de> serde::de::Visitor<'de> for Points {
            type Value = BoundedPoints;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of [time, \"value\"] points")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<BoundedPoints, A::Error> {
                let mut kept = Vec::new();
                let mut total = 0;
                loop {
                    let more = if total < MAX_POINTS_PER_SERIES {
                        seq.next_element::<(f64, String)>()?.map(|p| kept.push(p))
                    } else {
                        seq.next_element::<IgnoredAny>()?.map(|_| ())
                    };
                    if more.is_none() {
                        return Ok(BoundedPoints { kept, total });
                    }
                    total += 1;
                }
            }
        }
        d.deserialize_seq(Points)
    }
}

/// A thin client for `/api/v1/query` and `/api/v1/query_range`.
#[derive(Debug, Clone)]
pub struct PromClient {
    http: reqwest::Client,
    base: String,
    pub(super) timeout: Duration,
}

/// Formats unix seconds with millisecond precision, as Prometheus reads them.
pub fn format_time(t: f64) -> String {
    format!("{:.3}", (t * 1000.0).round() / 1000.0)
}

/// A PromQL range duration for `seconds`: whole seconds as `45s`, otherwise
/// milliseconds (`45500ms`), never below 1 ms.
pub fn format_range(seconds: f64) -> String {
    let ms = ((seconds * 1000.0).round() as i64).max(1);
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

impl PromClient {
    /// `base` is the Prometheus URL (`http://host:9090`, a path prefix is kept).
    pub(crate) fn new(
        base: &str,
        timeout: Duration,
        bearer_token: Option<&str>,
        headers: &[(String, String)],
        tls: &Tls,
    ) -> Result<Self, SignalError> {
        let parsed = reqwest::Url::parse(base).map_err(|e| SignalError::PrometheusUrl {
            url: base.to_string(),
            why: e.to_string(),
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(SignalError::PrometheusUrl {
                url: base.to_string(),
                why: "the scheme must be http or https".into(),
            });
        }
        let mut map = HeaderMap::new();
        let bad_header = |name: &str, why: String| SignalError::Header {
            value: name.to_string(),
            why,
        };
        if let Some(token) = bearer_token {
            let mut v = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
                .map_err(|e| bad_header("Authorization: Bearer <token>", e.to_string()))?;
            v.set_sensitive(true);
            map.insert(reqwest::header::AUTHORIZATION, v);
        }
        for (name, value) in headers {
            let n = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| bad_header(name, e.to_string()))?;
            let v = HeaderValue::from_str(value).map_err(|e| bad_header(name, e.to_string()))?;
            map.insert(n, v);
        }
        let http = tls
            .prometheus_builder()
            .default_headers(map)
            .connect_timeout(timeout)
            .build()
            .map_err(|e| SignalError::HttpClient(e.to_string()))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            timeout,
        })
    }

    /// An instant query at `time`.
    pub async fn query(&self, query: &str, time: f64) -> Result<Vec<Series>, QueryError> {
        self.get(
            "/api/v1/query",
            &[("query", query.to_string()), ("time", format_time(time))],
        )
        .await
    }

    /// A range query over `[start, end]` every `step` seconds.
    pub async fn query_range(
        &self,
        query: &str,
        start: f64,
        end: f64,
        step: f64,
    ) -> Result<Vec<Series>, QueryError> {
        self.get(
            "/api/v1/query_range",
            &[
                ("query", query.to_string()),
                ("start", format_time(start)),
                ("end", format_time(end)),
                ("step", format_time(step)),
            ],
        )
        .await
    }

    /// Runs a planned query.
    pub async fn planned(&self, planned: &Planned) -> Result<Vec<Series>, QueryError> {
        match planned {
            Planned::Range {
                query,
                start,
                end,
                step,
            } => self.query_range(query, *start, *end, *step).await,
            Planned::Instant { query, time } => self.query(query, *time).await,
        }
    }

    async fn get(&self, path: &str, params: &[(&str, String)]) -> Result<Vec<Series>, QueryError> {
        let url = format!("{}{path}", self.base);
        // Let Prometheus give up too, rather than keep evaluating for nobody.
        let mut params = params.to_vec();
        params.push(("timeout", format_time(self.timeout.as_secs_f64())));
        let params = &params;
        let fut = async {
            let mut resp = self
                .http
                .get(&url)
                .query(params)
                .send()
                .await
                .map_err(|e| self.transport(&url, &e))?;
            let status = resp.status().as_u16();
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| self.transport(&url, &e))? {
                if body.len() + chunk.len() > MAX_BODY_BYTES {
                    return Err(QueryError::Malformed {
                        why: format!("response larger than {MAX_BODY_BYTES} bytes"),
                        excerpt: excerpt(&String::from_utf8_lossy(&body)),
                    });
                }
                body.extend_from_slice(&chunk);
            }
            Ok((status, body))
        };
        // The timeout is Prometheus' to answer in. Decoding (up to 32 MiB of
        // JSON) runs on a blocking thread after it: never on the runtime,
        // where it would hold up the check's other queries until their own
        // timeouts fired on answers that had arrived.
        let (status, body) = match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(QueryError::Timeout(
                    humantime::format_duration(self.timeout).to_string(),
                ));
            }
        };
        tokio::task::spawn_blocking(move || decode(status, &body))
            .await
            .unwrap_or_else(|e| {
                Err(QueryError::Malformed {
                    why: format!("decoding the answer failed: {e}"),
                    excerpt: String::new(),
                })
            })
    }

    fn transport(&self, url: &str, e: &reqwest::Error) -> QueryError {
        if e.is_timeout() {
            return QueryError::Timeout(humantime::format_duration(self.timeout).to_string());
        }
        QueryError::Transport {
            url: url.to_string(),
            why: crate::scrape::describe_reqwest_error(e, self.timeout),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }
}

/// Checks the HTTP status and the API envelope, and extracts the series.
pub(crate) fn decode(status: u16, body: &[u8]) -> Result<Vec<Series>, QueryError> {
    let text = || excerpt(&String::from_utf8_lossy(body));
    // Only an object is an envelope: serde would read a list field by
    // field (`["error"]` as an API error without a message).
    let env = if body.trim_ascii_start().starts_with(b"{") {
        serde_json::from_slice::<Envelope>(body).map_err(|e| e.to_string())
    } else {
        Err("not a JSON object".to_string())
    };
    let env = match env {
        Ok(env) => env,
        Err(why) if (200..300).contains(&status) => {
            return Err(QueryError::Malformed {
                why,
                excerpt: text(),
            });
        }
        Err(_) => {
            return Err(QueryError::Http {
                status,
                excerpt: text(),
            });
        }
    };
    for w in &env.warnings {
        tracing::warn!("prometheus warning: {w}");
    }
    if env.status != "success" {
        return Err(QueryError::Api {
            status,
            error_type: env.error_type.unwrap_or_else(|| "unknown".into()),
            error: env.error.unwrap_or_else(|| "(no message)".into()),
        });
    }
    if !(200..300).contains(&status) {
        return Err(QueryError::Http {
            status,
            excerpt: text(),
        });
    }
    if env.data.is_none() {
        return Err(QueryError::Malformed {
            why: "success without data".into(),
            excerpt: text(),
        });
    }
    let answer: Answer = serde_json::from_slice(body).map_err(|e| QueryError::Malformed {
        why: format!("bad result: {e}"),
        excerpt: text(),
    })?;
    let parse_points = |pts: Vec<(f64, String)>| -> Result<Vec<(f64, f64)>, QueryError> {
        pts.into_iter()
            .map(|(t, v)| {
                v.parse::<f64>()
                    .map(|v| (t, v))
                    .map_err(|_| QueryError::Malformed {
                        why: format!("sample value {v:?} is not a number"),
                        excerpt: text(),
                    })
            })
            .collect()
    };
    let series = |metric, points| Series {
        labels: metric,
        points,
    };
    match answer.data {
        Data::Matrix(items) => items
            .into_iter()
            .map(|i| {
                if i.values.total > MAX_POINTS_PER_SERIES {
                    return Err(QueryError::TooManyPoints {
                        points: i.values.total,
                    });
                }
                Ok(series(i.metric, parse_points(i.values.kept)?))
            })
            .collect(),
        Data::Vector(items) => items
            .into_iter()
            .map(|i| Ok(series(i.metric, parse_points(vec![i.value])?)))
            .collect(),
        Data::Scalar(point) => Ok(vec![series(BTreeMap::new(), parse_points(vec![point])?)]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_times_and_ranges() {
        assert_eq!(format_time(112.0), "112.000");
        assert_eq!(format_time(1_700_000_000.123_4), "1700000000.123");
        assert_eq!(format_range(45.0), "45s");
        assert_eq!(format_range(45.5), "45500ms");
        assert_eq!(format_range(0.0), "1ms");
    }

    #[test]
    fn decodes_envelopes() {
        let ok = br#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"2"],[2,"NaN"]]}]}}"#;
        let s = decode(200, ok).unwrap();
        assert_eq!(s[0].points[0], (1.0, 2.0));
        assert!(s[0].points[1].1.is_nan());
        let err = br#"{"status":"error","errorType":"bad_data","error":"parse error at 1:5"}"#;
        assert_eq!(
            decode(400, err).unwrap_err().to_string(),
            "prometheus: bad_data: parse error at 1:5 (HTTP 400)"
        );
        let html = b"<html><body>502 Bad Gateway</body></html>";
        let e = decode(502, html).unwrap_err().to_string();
        assert!(e.contains("HTTP 502") && e.contains("Bad Gateway"), "{e}");
        let e = decode(200, b"{\"status\":").unwrap_err().to_string();
        assert!(e.contains("malformed"), "{e}");
        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[3,"+Inf"]}}"#;
        assert_eq!(decode(200, scalar).unwrap()[0].points[0].1, f64::INFINITY);
        let e = decode(200, br#"{"status":"success"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("success without data"), "{e}");
        let e = decode(
            200,
            br#"{"status":"success","data":{"resultType":"string","result":[1,"x"]}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("malformed") && e.contains("string"), "{e}");
        // An error answer is reported as such whatever its data holds.
        let e = decode(
            422,
            br#"{"status":"error","errorType":"execution","error":"too many samples","data":7}"#,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "prometheus: execution: too many samples (HTTP 422)");
    }

    /// Found by the `prometheus_response` fuzz target: a JSON list is no
    /// envelope, whatever the status (serde read `["[",0]` field by field,
    /// as an API error without a message).
    #[test]
    fn a_json_list_is_no_envelope() {
        let e = decode(200, br#"["[",0]"#).unwrap_err().to_string();
        assert!(e.contains("malformed response (not a JSON object)"), "{e}");
        let e = decode(502, br#"["error","x"]"#).unwrap_err().to_string();
        assert!(
            e.contains("HTTP 502 with a non-API body: [\"error\",\"x\"]"),
            "{e}"
        );
    }

    /// A range-query series longer than Prometheus ever answers is refused
    /// (its points past the limit are skipped unparsed), saying how long.
    #[test]
    fn a_series_beyond_the_resolution_limit_is_refused() {
        let answer = |n: usize| {
            let points: Vec<String> = (0..n).map(|i| format!("[{i},\"1\"]")).collect();
            format!(
                r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{}},"values":[{}]}}]}}}}"#,
                points.join(",")
            )
        };
        let ok = decode(200, answer(MAX_POINTS_PER_SERIES).as_bytes()).unwrap();
        assert_eq!(ok[0].points.len(), MAX_POINTS_PER_SERIES);
        let e = decode(200, answer(400_000).as_bytes()).unwrap_err();
        assert_eq!(e, QueryError::TooManyPoints { points: 400_000 });
        assert!(e.to_string().contains("400000 points"), "{e}");
    }
}
