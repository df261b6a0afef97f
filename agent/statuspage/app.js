// nsmd status page: polls GET /v1/overview of the node that served it and
// redraws. Every value from the server — above all mon_name and my_name,
// which are whatever bytes a client sent — reaches the page as a text node
// (textContent, createTextNode), never as HTML.
'use strict';

(() => {
  const pollEvery = 1000; // ms between reads, also while the node is down
  const readTimeout = 2000; // ms before a read counts as failed

  const page = {
    token: '', // admin token typed by the operator: this tab's memory only
    history: [], // [{state, node, reason, at}], newest first
    failures: 0, // consecutive failed reads
    downSince: null,
    lastOK: null,
    node: '',
  };

  const $ = (id) => document.getElementById(id);

  // stepTable is a takeover's steps, in order: [{name, label, always}].
  const stepTable = JSON.parse($('timeline').dataset.steps || '[]');

  // el builds an element; children are nodes or strings (made text nodes).
  function el(tag, cls, ...children) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    for (const c of children) {
      e.append(c instanceof Node ? c : document.createTextNode(String(c ?? '')));
    }
    return e;
  }

  function setText(id, v) { $(id).textContent = String(v ?? ''); }

  function row(...cells) { return el('tr', '', ...cells.map((c) => (c instanceof Node ? c : el('td', '', c)))); }

  function fmtTime(s) {
    if (!s) return '';
    const d = new Date(s);
    return isNaN(d) || d.getUTCFullYear() < 2 ? '' : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
  }

  function render(o) {
    const s = o.status;
    page.node = s.node_id;
    setText('node', s.node_id + ' (' + s.role + ')');
    document.title = 'nsmd ' + s.node_id + ': ' + (s.leader_id ? 'leader ' + s.leader_id : 'no leader');
    setText('leader', s.leader_id || 'none known (election under way?)');
    setText('term', s.term);
    setText('sm-state', s.sm_state);

    let vip = s.vip || 'none configured';
    if (s.vip) vip += s.vip_held ? ' — held by this node (' + s.node_id + ')' : ' — not held by this node; the leader (' + (s.leader_id || 'none') + ') holds it when serving';
    setText('vip', vip);

    const now = new Date(o.now).getTime();
    if (s.grace_until) {
      const left = Math.round((new Date(s.grace_until).getTime() - now) / 1000);
      setText('grace', left > 0 ? 'open, ends in ' + left + ' s (' + fmtTime(s.grace_until) + ')' : 'closed at ' + fmtTime(s.grace_until));
    } else {
      setText('grace', 'none yet');
    }
    const self = [s.ready ? 'ready' : 'NOT ready (sm_state of this incarnation unknown here)',
      'raft ' + s.raft_state, 'applied ' + s.applied_index, s.tls ? 'TLS' : 'no TLS'];
    if (s.version && s.version.version) {
      self.push('version ' + s.version.version + (s.version.revision ? ' (' + s.version.revision.slice(0, 12) + (s.version.modified ? ', modified' : '') + ')' : ''));
    }
    if (s.disk && s.disk.writable === false) self.push('DISK NOT WRITABLE');
    if (s.insecure && s.insecure.length) self.push('insecure: ' + s.insecure.join('; '));
    if (s.last_hook_failure) self.push('last hook failure: ' + JSON.stringify(s.last_hook_failure));
    setText('self', self.join(' · '));

    renderServices(o.services || []);

    $('members').tBodies[0].replaceChildren(...(o.members || []).map((m) => row(
      m.id,
      el('td', 'role-' + m.role, m.role + (m.witness && m.leader ? ' (leading)' : '')),
      el('td', 'health-' + m.state, m.state),
      m.suffrage || 'not in raft',
      m.version || '',
      m.nsm_addr || '',
      m.raft_addr || '')));

    const v4 = s.nfsv4 || {};
    let tracking = v4.tracking
      ? 'served (pipe ' + ((v4.pipe && v4.pipe.state) || '?') + (v4.pipe && v4.pipe.error ? ': ' + v4.pipe.error : '') + ')'
      : 'not served (' + (v4.tracking_off_why || 'off') + ')';
    tracking += ' · epoch ' + (v4.current_epoch ?? '?') + ' · ' + (v4.clients ?? 0) + ' client records';
    if (v4.recovery_epoch) tracking += ' · in grace: ' + (v4.reclaimed ?? 0) + ' of ' + (v4.reclaimable ?? 0) + ' clients reclaimed';
    setText('nfsv4', tracking);
    const f = s.fence || {};
    let fence = {none: 'none (this node serves no storage)', off: 'OFF: this node serves storage without any fence'}[f.mode] || f.mode || '?';
    if (f.watchdog) {
      const w = f.watchdog;
      fence += ' · watchdog ' + w.device + ' ' + w.timeout_seconds + ' s: ' + (w.armed ? (w.starving ? 'armed, NOT FED' : 'armed, fed') : 'disarmed');
      if (w.deadline) fence += ', resets the machine at ' + fmtTime(w.deadline) + ' unless fed';
    }
    if (f.serving) fence += ' · serving';
    if (f.stop_failed) fence += ' · STOP FAILED: the watchdog resets this node';
    if (f.waiting) fence += ' · waiting for the other servers to be proven stopped';
    if (f.last_wait) {
      fence += ' · last wait before serving ' + f.last_wait.seconds.toFixed(1) + ' s: ' +
        (f.last_wait.nodes || []).map((n) => n.node + ' ' + n.by + ' after ' + n.seconds.toFixed(1) + ' s').join(', ');
    }
    setText('fence', fence);
    const pr = f.promises;
    let promises = '–';
    if (pr && pr.servers && pr.servers.length) {
      promises = pr.servers.map((p) => p.node + ' ' + p.mode + (p.mode === 'watchdog' ? ' ' + p.watchdog_seconds + ' s' : '') + (p.serving ? ' (serving)' : '')).join(', ');
      if (pr.mismatch) promises += ' · MISMATCH: the servers promise different fencing';
      if (pr.unproven && pr.unproven.length) promises += ' · WAITING for ' + pr.unproven.join(', ') + ' to answer, be fenced, or be confirmed off (nsmd fence confirm NODE)';
      for (const c of pr.confirmations || []) promises += ' · ' + c.node + ' confirmed off by ' + c.by + ' at ' + fmtTime(c.at);
    }
    setText('fence-promises', promises);
    const g = s.grace;
    setText('kgrace', g
      ? graceManager('lockd', g.nlm) + ' · ' + graceManager('nfsd', g.nfsv4) + (g.error ? ' · ' + g.error : '')
      : 'this node has not served since it started');

    const n = s.notify || {};
    const total = n.targets || 0;
    setText('notify', total
      ? 'sm_state ' + n.state + ': ' + n.done + ' of ' + total + ' hosts notified, ' + n.pending + ' pending, ' + n.failed + ' given up'
      : (s.role === 'leader' ? 'no monitored host to notify'
        : 'only the leader notifies: see the page of ' + (s.leader_id || 'the leader, once elected')));
    $('notify-bar').max = Math.max(total, 1);
    $('notify-bar').value = n.done || 0;

    const t = o.last_takeover;
    if (t && !page.history.some((h) => h.at === t.at)) {
      page.history.unshift({ state: s.sm_state, node: t.node, reason: t.reason, at: t.at });
      page.history.length = Math.min(page.history.length, 50);
    }
    $('history').tBodies[0].replaceChildren(...page.history.map((h) => row(h.state, h.node, h.reason || '', fmtTime(h.at))));

    const tl = s.takeover;
    const steps = [];
    if (tl) {
      const t0 = new Date(tl.elected).getTime();
      // The step table comes with the page (data-steps, from the server's
      // one definition): steps always present show "not reached"; the
      // others show once reached; a step the table does not name (a newer
      // node's) shows under its name.
      const known = new Set(stepTable.map((d) => d.name));
      const table = stepTable.concat(Object.keys(tl).filter((k) => k !== 'sm_state' && !known.has(k)).map((k) => ({ name: k, label: k })));
      for (const d of table) {
        const at = tl[d.name];
        const ok = at && new Date(at).getUTCFullYear() > 1;
        if (ok) {
          const after = new Date(at).getTime() - t0; // before the election for the previous leader's last word
          steps.push(row(d.label, fmtTime(at), (after < 0 ? '' : '+') + after + ' ms'));
        } else if (d.always) {
          steps.push(row(d.label, 'not reached', ''));
        }
      }
      steps.push(row('sm_state', tl.sm_state, ''));
    } else {
      steps.push(row('this node has not taken over since it started', '', ''));
    }
    $('timeline').tBodies[0].replaceChildren(...steps);

    const r = o.registrations;
    setText('reg-count', '(' + r.total + ')');
    $('reg-hidden').hidden = !r.hidden;
    $('token-form').hidden = !r.hidden;
    setText('reg-hidden', r.hidden || '');
    $('regs').tBodies[0].replaceChildren(...r.rows.map((g) => row(g.mon_name, g.my_name, g.node, fmtTime(g.added))));
    setText('reg-more', r.hidden ? '' : (r.more > 0 ? 'and ' + r.more + ' more not listed (nsmd registrations --admin ADDR lists all)' : ''));
  }

  // graceManager is one lock manager's grace (a node's, or a service's)
  // in words.
  function graceManager(name, m) {
    if (!m) return name + ' ?';
    if (m.absent) return name + ' not running here';
    const back = m.back + ' of ' + m.expected + ' clients back';
    if (m.ended) return name + ' ended after ' + (m.seconds || 0).toFixed(1) + ' s (' + m.ended.reason + ', ' + back + ')';
    const who = (m.missing || []).map((c) => (m.last_seen && m.last_seen[c]) ? c + ' (last seen ' + m.last_seen[c] + ')' : c);
    if (m.missing_hidden) who.push(m.missing_hidden + ' not named (names are shown only to an operator: the admin token below)');
    return name + ' open (' + back + (who.length ? ', waiting for ' + who.join(', ') : '') + ')';
  }

  // renderServices lists the cluster's NFS services; the section shows
  // only when there are some (a cluster without services: has none).
  function renderServices(list) {
    $('services-section').hidden = list.length === 0;
    $('services').tBodies[0].replaceChildren(...list.map((v) => {
      const m = v.last_move;
      const move = m ? (m.from || '(unplaced)') + ' → ' + m.to + ' (' + m.reason + ') at ' + fmtTime(m.at) + ', epoch ' + m.epoch : '';
      let conflict = v.conflict || '';
      if (conflict && v.declared_by) {
        conflict += ' · ' + Object.keys(v.declared_by).sort().map((n) => n + ' ' + (v.declared_by[n] || 'does not declare it')).join(', ');
      }
      return row(v.id, v.address, v.owner || '–', v.epoch, el('td', 'state-' + v.state, v.state), here(v), move, conflict);
    }));
  }

  // here is what this node does with service v: its run (phase, epoch,
  // lease left, how the previous server was proven stopped) and what it
  // holds (the address, the last hook, its NFSv4 tracking and grace);
  // empty when it has none of it.
  function here(v) {
    const parts = [];
    const r = v.run;
    if (r) {
      parts.push(r.phase + ' at epoch ' + r.epoch, 'lease ' + Number(r.lease_seconds).toFixed(1) + ' s');
      if (r.proof) parts.push(r.proof.node + ' proven stopped (' + r.proof.by + ')');
    }
    const l = v.local;
    if (l) {
      if (!r) parts.push(l.phase);
      parts.push(l.address_held ? 'address held' : 'address not held');
      const h = l.last_hook;
      if (h) parts.push(h.hook + ' ' + h.reason + (h.error ? ' FAILED: ' + h.error : ' ok') + ' at ' + fmtTime(h.at));
      const v4 = l.nfsv4;
      if (v4) {
        let t = 'NFSv4 tracking ' + (v4.tracking ? 'pipe ' + ((v4.pipe && v4.pipe.state) || '?') : 'not served') + ', ' + v4.clients + ' client records';
        if (v4.recovery_epoch) t += ', ' + v4.reclaimed + ' of ' + v4.reclaimable + ' reclaimed';
        parts.push(t);
      }
      const g = l.grace;
      if (g) parts.push('grace since ' + fmtTime(g.started) + ': ' + graceManager('lockd', g.nlm) + ', ' + graceManager('nfsd', g.nfsv4));
    }
    return el('td', r ? 'run-' + r.phase : '', parts.join(' · '));
  }

  function setConn(ok, err) {
    const c = $('conn');
    if (ok) {
      c.className = 'conn ok';
      c.textContent = 'live · ' + new Date(page.lastOK).toLocaleTimeString();
      return;
    }
    c.className = 'conn down';
    const who = page.node ? 'node ' + page.node : 'this node';
    c.textContent = who + ' unreachable since ' + new Date(page.downSince).toLocaleTimeString() +
      ' (' + err + '); retrying, attempt ' + page.failures;
  }

  async function poll() {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), readTimeout);
    try {
      const headers = page.token ? { Authorization: 'Bearer ' + page.token } : {};
      const resp = await fetch('/v1/overview', { headers, signal: ctl.signal, cache: 'no-store' });
      if (!resp.ok) throw new Error('HTTP ' + resp.status);
      const o = await resp.json();
      page.failures = 0;
      page.downSince = null;
      page.lastOK = Date.now();
      render(o);
      setConn(true);
    } catch (e) {
      page.failures++;
      if (page.downSince === null) page.downSince = Date.now();
      setConn(false, e.name === 'AbortError' ? 'no answer in ' + readTimeout / 1000 + ' s' : e.message);
    } finally {
      clearTimeout(timer);
      setTimeout(poll, pollEvery);
    }
  }

  $('token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    page.token = $('token').value.trim(); // used from the next read on
  });
  poll();
})();
