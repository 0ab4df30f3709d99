//! Process-wide shared data, shared queues and metrics (one per running host).
//!
//! Shared data follows cpp-host `shared_data.cc`: keyed by `vm_id` (so every plugin with
//! the same vm_id, including `""`, shares it); `set` with cas 0 is unconditional, with a
//! cas on an existing key it must match (else `CasMismatch`), and a set on an absent key
//! succeeds whatever the cas; every set takes a new cas from one counter that skips 0;
//! nothing is ever deleted.
//!
//! Metrics follow Envoy `Context::defineMetric/incrementMetric/recordMetric/getMetric`
//! (context.cc): one process-wide stat per name (values add up across workers), counter
//! increments must be > 0, histograms take only `record`, `get` on a histogram is
//! `BadArgument`. The stat name is `wasmcustom.<name>`; Prometheus output strips that
//! prefix and maps characters outside `[a-zA-Z0-9_]` to `_` (envoy PR #17357).

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU32;
use std::sync::{Mutex, MutexGuard, PoisonError};

use proxy_wasm_host::abi::v0_2_1::types::{MetricType, Status};
use proxy_wasm_host::abi::v0_2_1::{Invocation, MetricId, QueueId, SharedServices, SharedValue};

/// Envoy's default histogram buckets (`HistogramSettingsImpl::defaultBuckets`).
const BUCKETS: [f64; 19] = [
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0, 60000.0, 300000.0,
    600000.0, 1800000.0, 3600000.0,
];

#[derive(Debug, Clone)]
struct Metric {
    kind: MetricType,
    name: String,
    value: u64,
    /// Histogram samples: counts per bucket, plus sum and count.
    buckets: [u64; 19],
    sum: f64,
    count: u64,
}

/// `(vm_id, key)`.
type DataKey = (Vec<u8>, Vec<u8>);
/// `(vm_id, name, items)`.
type Queue = (Vec<u8>, Vec<u8>, VecDeque<Vec<u8>>);

#[derive(Default)]
struct Inner {
    data: HashMap<DataKey, (Vec<u8>, NonZeroU32)>,
    next_cas: u32,
    metrics: Vec<Metric>,
    metric_ids: HashMap<(i32, String), u32>,
    queues: Vec<Queue>,
}

/// The shared services of one running host.
#[derive(Default)]
pub struct Shared {
    inner: Mutex<Inner>,
}

fn kind_code(kind: MetricType) -> i32 {
    match kind {
        MetricType::Counter => 0,
        MetricType::Gauge => 1,
        _ => 2,
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn metric<R>(&self, id: MetricId, f: impl FnOnce(&mut Metric) -> Result<R, Status>) -> Result<R, Status> {
        let mut inner = self.lock();
        let index = usize::try_from(id.get()).map_err(|_| Status::NotFound)?;
        let metric = inner.metrics.get_mut(index.wrapping_sub(1)).ok_or(Status::NotFound)?;
        f(metric)
    }

    /// The value of a counter or gauge by its plugin-side name, for tests and the admin.
    pub fn metric_value(&self, name: &str) -> Option<u64> {
        self.lock()
            .metrics
            .iter()
            .find(|m| m.name == name && !matches!(m.kind, MetricType::Histogram))
            .map(|m| m.value)
    }

    /// Envoy's `/stats/prometheus` text for the custom metrics.
    pub fn prometheus(&self) -> String {
        let inner = self.lock();
        let mut metrics: Vec<&Metric> = inner.metrics.iter().collect();
        metrics.sort_by(|a, b| a.name.cmp(&b.name));
        let mut out = String::new();
        for metric in metrics {
            let name: String = metric
                .name
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
                .collect();
            match metric.kind {
                MetricType::Counter => {
                    out.push_str(&format!("# TYPE {name} counter\n{name}{{}} {}\n", metric.value));
                }
                MetricType::Gauge => {
                    out.push_str(&format!("# TYPE {name} gauge\n{name}{{}} {}\n", metric.value));
                }
                _ => {
                    out.push_str(&format!("# TYPE {name} histogram\n"));
                    // Buckets are cumulative: a sample counts in every bucket at or above it.
                    for (bound, count) in BUCKETS.iter().zip(metric.buckets.iter()) {
                        out.push_str(&format!("{name}_bucket{{le=\"{bound}\"}} {count}\n"));
                    }
                    out.push_str(&format!("{name}_bucket{{le=\"+Inf\"}} {}\n", metric.count));
                    out.push_str(&format!("{name}_sum{{}} {}\n", metric.sum));
                    out.push_str(&format!("{name}_count{{}} {}\n", metric.count));
                }
            }
        }
        out
    }
}

impl SharedServices for Shared {
    fn get_shared_data(&self, _: Invocation, vm_id: &[u8], key: &[u8]) -> Result<SharedValue, Status> {
        let inner = self.lock();
        inner
            .data
            .get(&(vm_id.to_vec(), key.to_vec()))
            .map(|(bytes, cas)| SharedValue::new(bytes.clone(), *cas))
            .ok_or(Status::NotFound)
    }

    fn set_shared_data(
        &self,
        _: Invocation,
        vm_id: &[u8],
        key: &[u8],
        value: &[u8],
        cas: Option<u32>,
    ) -> Result<(), Status> {
        let mut inner = self.lock();
        let slot = (vm_id.to_vec(), key.to_vec());
        // cpp-host: a cas only guards an existing key; an absent key always takes the set.
        if let (Some(expected), Some((_, current))) = (cas, inner.data.get(&slot))
            && current.get() != expected
        {
            return Err(Status::CasMismatch);
        }
        inner.next_cas = inner.next_cas.wrapping_add(1);
        if inner.next_cas == 0 {
            inner.next_cas = 1;
        }
        let next = NonZeroU32::new(inner.next_cas).unwrap_or(NonZeroU32::MIN);
        inner.data.insert(slot, (value.to_vec(), next));
        Ok(())
    }

    fn register_shared_queue(&self, _: Invocation, vm_id: &[u8], name: &[u8]) -> Result<QueueId, Status> {
        let mut inner = self.lock();
        let index = match inner.queues.iter().position(|(v, n, _)| v == vm_id && n == name) {
            Some(index) => index,
            None => {
                inner.queues.push((vm_id.to_vec(), name.to_vec(), VecDeque::new()));
                inner.queues.len() - 1
            }
        };
        queue_id(index)
    }

    fn resolve_shared_queue(&self, _: Invocation, vm_id: &[u8], name: &[u8]) -> Result<QueueId, Status> {
        let inner = self.lock();
        let index = inner
            .queues
            .iter()
            .position(|(v, n, _)| v == vm_id && n == name)
            .ok_or(Status::NotFound)?;
        queue_id(index)
    }

    fn enqueue_shared_queue(&self, _: Invocation, queue: QueueId, value: &[u8]) -> Result<(), Status> {
        let mut inner = self.lock();
        let index = (queue.get() as usize).wrapping_sub(1);
        let (_, _, items) = inner.queues.get_mut(index).ok_or(Status::NotFound)?;
        items.push_back(value.to_vec());
        Ok(())
    }

    fn dequeue_shared_queue(&self, _: Invocation, queue: QueueId) -> Result<Vec<u8>, Status> {
        let mut inner = self.lock();
        let index = (queue.get() as usize).wrapping_sub(1);
        let (_, _, items) = inner.queues.get_mut(index).ok_or(Status::NotFound)?;
        items.pop_front().ok_or(Status::Empty)
    }

    fn define_metric(&self, _: Invocation, _vm_id: &[u8], kind: MetricType, name: &[u8]) -> Result<MetricId, Status> {
        // Envoy's stats are process-wide by name, whatever the vm_id.
        let name = String::from_utf8_lossy(name).into_owned();
        let mut inner = self.lock();
        let key = (kind_code(kind), name.clone());
        if let Some(id) = inner.metric_ids.get(&key) {
            return MetricId::try_from(*id).map_err(|_| Status::InternalFailure);
        }
        inner.metrics.push(Metric {
            kind,
            name,
            value: 0,
            buckets: [0; 19],
            sum: 0.0,
            count: 0,
        });
        let id = u32::try_from(inner.metrics.len()).map_err(|_| Status::InternalFailure)?;
        inner.metric_ids.insert(key, id);
        MetricId::try_from(id).map_err(|_| Status::InternalFailure)
    }

    fn record_metric(&self, _: Invocation, metric: MetricId, value: u64) -> Result<(), Status> {
        self.metric(metric, |m| {
            match m.kind {
                // Envoy: recordMetric on a counter adds the value.
                MetricType::Counter => m.value = m.value.wrapping_add(value),
                MetricType::Gauge => m.value = value,
                _ => {
                    m.count += 1;
                    m.sum += value as f64;
                    for (bound, count) in BUCKETS.iter().zip(m.buckets.iter_mut()) {
                        if (value as f64) <= *bound {
                            *count += 1;
                        }
                    }
                }
            }
            Ok(())
        })
    }

    fn increment_metric(&self, _: Invocation, metric: MetricId, delta: i64) -> Result<(), Status> {
        self.metric(metric, |m| match m.kind {
            // Envoy: a counter only goes up; offset <= 0 is BadArgument.
            MetricType::Counter if delta > 0 => {
                m.value = m.value.wrapping_add(delta.unsigned_abs());
                Ok(())
            }
            MetricType::Gauge => {
                m.value = m.value.wrapping_add_signed(delta);
                Ok(())
            }
            _ => Err(Status::BadArgument),
        })
    }

    fn get_metric(&self, _: Invocation, metric: MetricId) -> Result<u64, Status> {
        self.metric(metric, |m| match m.kind {
            MetricType::Counter | MetricType::Gauge => Ok(m.value),
            _ => Err(Status::BadArgument),
        })
    }
}

fn queue_id(index: usize) -> Result<QueueId, Status> {
    let id = u32::try_from(index + 1).map_err(|_| Status::InternalFailure)?;
    QueueId::try_from(id).map_err(|_| Status::InternalFailure)
}
