// Validates custom resources against their CRDs' schemas, as packaged by
// kubernetes-models from the projects' own CRDs (package.json pins them).
// Reads a JSON array of manifests on stdin; prints one line per invalid
// one; exits 1 if any is invalid or of a kind it has no schema for.
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";

const MODELS = {
  "keda.sh/v1alpha1/ScaledObject": ScaledObject,
  "monitoring.coreos.com/v1/PrometheusRule": PrometheusRule,
  "monitoring.coreos.com/v1/ServiceMonitor": ServiceMonitor,
};

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const manifests = JSON.parse(Buffer.concat(chunks).toString("utf8"));
let failed = 0;
for (const manifest of manifests) {
  const key = `${manifest.apiVersion}/${manifest.kind}`;
  const Model = MODELS[key];
  const name = manifest.metadata?.name;
  if (!Model) {
    console.log(`${key} ${name}: no schema for this kind`);
    failed++;
    continue;
  }
  try {
    new Model(manifest).validate();
  } catch (err) {
    console.log(`${key} ${name}: ${err.message}`);
    failed++;
  }
}
console.log(`crds: ${manifests.length - failed} of ${manifests.length} valid`);
process.exit(failed ? 1 : 0);
