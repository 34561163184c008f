// The server's /metrics at a glance (the panel beside the chat), fetched every 10 s and after each answer.
"use strict";

// Prometheus text -> {name: value}, summed over each sample's labels.
function parseMetrics(text) {
  const values = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const space = line.lastIndexOf(" ");
    const sample = line.slice(0, space);
    const name = sample.includes("{") ? sample.slice(0, sample.indexOf("{")) : sample;
    values[name] = (values[name] || 0) + Number(line.slice(space + 1));
  }
  return values;
}

function ratio(numerator, denominator) {
  return denominator ? numerator / denominator : null;
}

function figures(values) {
  const get = (name) => values["specgguf_" + name] || 0;
  const drafted = get("tokens_drafted_total");
  const acceptance = ratio(get("tokens_accepted_total"), drafted);
  const speed = ratio(get("tokens_per_second_sum"), get("tokens_per_second_count"));
  const firstToken = ratio(get("time_to_first_token_seconds_sum"), get("time_to_first_token_seconds_count"));
  const cached = ratio(get("prompt_tokens_cached_total"), get("prompt_tokens_total"));
  const percent = (value) => (value === null ? "–" : `${Math.round(value * 100)}%`);
  const generated = get("tokens_generated_total");
  return [
    ["requests", String(get("requests_total"))],
    ["waiting", String(get("queue_length"))],
    ["tokens generated", String(generated)],
    ["tokens drafted", String(drafted)],
    ["draft acceptance", acceptance === null ? (generated ? "none drafted" : "–") : percent(acceptance)],
    ["mean tok/s", speed === null ? "–" : speed.toFixed(1)],
    ["mean first token", firstToken === null ? "–" : `${Math.round(firstToken * 1000)} ms`],
    ["prompt cached", percent(cached)],
  ];
}

async function refreshMetrics() {
  let response;
  try {
    response = await fetch("metrics", { headers: requestHeaders(false) });
  } catch {
    $("metrics-note").textContent = "the server does not answer";
    return;
  }
  if (!response.ok) {
    $("metrics-note").textContent = await errorMessage(response);
    return;
  }
  const values = parseMetrics(await response.text()); // read whole before the panel changes
  const list = $("figures");
  list.replaceChildren();
  for (const [label, value] of figures(values)) {
    const term = document.createElement("dt");
    const detail = document.createElement("dd");
    term.textContent = label;
    detail.textContent = value;
    list.append(term, detail);
  }
  $("metrics-note").textContent = "since the server started · GET /metrics";
}
