//! The web console and the API viewer, embedded in the binary.

/// The API viewer at `/docs`: renders `/v1/openapi.json`, no network beyond this server.
pub const DOCS: &str = include_str!("../assets/docs.html");

pub const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>gnomon</title>
<style>
body{font:14px system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin-bottom:2em}td,th{border-bottom:1px solid #ddd;padding:4px 10px;text-align:left}
.succeeded{color:#080}.failed,.timed_out,.lost{color:#b00}.running,.assigned{color:#05a}.skipped,.cancelled{color:#888}
code{background:#f4f4f4;padding:1px 4px}
</style></head><body>
<h1>gnomon</h1><p id="leader"></p>
<h2>Jobs</h2><table id="jobs"><thead><tr><th>name</th><th>schedule</th><th>executor</th><th>paused</th><th>last scheduled</th><th>next fire</th></tr></thead><tbody></tbody></table>
<h2>Recent runs</h2><table id="runs"><thead><tr><th>id</th><th>job</th><th>scheduled</th><th>state</th><th>attempt</th><th>reason</th></tr></thead><tbody></tbody></table>
<script>
const token = localStorage.getItem('gnomon_token');
const opts = token ? {headers:{Authorization:'Bearer '+token}} : {};
function esc(s){return String(s??'').replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]))}
async function load(){
  try{
    const l = await (await fetch('/v1/leader',opts)).json();
    document.getElementById('leader').innerHTML = 'leader <code>'+esc(l.holder)+'</code> token '+esc(l.token)+' via '+esc(l.backend);
    const j = await (await fetch('/v1/jobs',opts)).json();
    document.querySelector('#jobs tbody').innerHTML = (j.jobs||[]).map(x=>'<tr><td>'+esc(x.name)+'</td><td><code>'+esc(JSON.stringify(x.schedule))+'</code></td><td>'+esc(Object.keys(x.executor)[0])+'</td><td>'+esc(x.status.paused)+'</td><td>'+esc(x.status.last_scheduled_at)+'</td><td>'+esc(x.status.next_fire_at)+'</td></tr>').join('');
    const r = await (await fetch('/v1/runs?limit=50',opts)).json();
    document.querySelector('#runs tbody').innerHTML = (r.runs||[]).map(x=>'<tr><td>'+esc(x.id)+'</td><td>'+esc(x.job)+'</td><td>'+esc(x.scheduled_at)+'</td><td class="'+esc(x.state)+'">'+esc(x.state)+'</td><td>'+esc(x.attempt)+'</td><td>'+esc(x.reason)+'</td></tr>').join('');
  }catch(e){document.getElementById('leader').textContent='error: '+e}
}
load();setInterval(load,2000);
</script></body></html>"#;
