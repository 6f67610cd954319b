// The waiting-room page (docs/storefront.md, "The waiting-room page"): it enters the line
// for the shopper the store's signed entry link names, shows the place and the estimated
// wait, polls at the pace the server asks, keeps the admission in sessionStorage so a
// reload keeps the place, and sends the shopper to the sale's return URL once admitted.
'use strict';
(function () {
  const main = document.getElementById('room');
  const sale = main.dataset.sale;
  const place = document.getElementById('place');
  const wait = document.getElementById('wait');
  const problem = document.getElementById('problem');
  const cont = document.getElementById('continue');
  const contLink = document.getElementById('continue-link');
  const again = document.getElementById('again');
  const againButton = document.getElementById('again-button');
  const base = '/room/' + encodeURIComponent(sale);
  const storeKey = 'quota-room:' + sale;
  let timer = 0;

  // saved is what this tab keeps of its place: the admission id and the entry link it was
  // made with (to enter again when the region lost the admission in a failover).
  function saved() {
    try {
      return JSON.parse(sessionStorage.getItem(storeKey) || 'null');
    } catch (e) {
      return null;
    }
  }
  function save(s) {
    sessionStorage.setItem(storeKey, JSON.stringify(s));
  }

  function show(el, text) {
    if (el.textContent !== text) el.textContent = text; // unchanged text is not announced again
  }
  function say(state, text, waitText) {
    place.dataset.state = state;
    show(place, text);
    show(wait, waitText || '');
  }
  function fail(text) {
    clearTimeout(timer);
    say('problem', 'You are not in the line.');
    problem.hidden = false;
    show(problem, text);
  }
  function later(ms, fn) {
    clearTimeout(timer);
    timer = setTimeout(fn, ms);
  }

  // duration says a wait in words, coarse enough that the live region is not read out at
  // every poll.
  function duration(ms) {
    const s = Math.ceil((ms || 0) / 1000);
    if (s < 60) return 'less than a minute';
    const m = Math.round(s / 60);
    if (m < 60) return 'about ' + m + (m === 1 ? ' minute' : ' minutes');
    const h = Math.round(m / 60);
    return 'about ' + h + (h === 1 ? ' hour' : ' hours');
  }

  // pace is how long to wait before the next call, as the server asked: retry_after_ms, or
  // Retry-After in seconds; within 250 ms and a minute.
  function pace(resp, body) {
    let ms = body && body.retry_after_ms;
    if (!ms) {
      const secs = Number(resp.headers.get('Retry-After'));
      if (secs > 0) ms = secs * 1000;
    }
    return Math.min(Math.max(ms || 1000, 250), 60000);
  }

  async function call(method, path, body) {
    const init = { method: method, headers: { Accept: 'application/json' }, cache: 'no-store', credentials: 'omit' };
    if (body) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(base + path, init);
    } catch (e) {
      say('retrying', 'Cannot reach the waiting room; trying again.');
      later(2000, next);
      return;
    }
    let data = null;
    try {
      data = await resp.json();
    } catch (e) {
      data = null;
    }
    if (resp.ok && data) {
      answer(resp, data);
    } else {
      refused(resp, (data && data.error) || { code: 'HTTP_' + resp.status, message: 'The waiting room answered ' + resp.status + '.' });
    }
  }

  // answer shows an admission and schedules what comes next.
  function answer(resp, a) {
    const s = saved() || {};
    s.id = a.admission_id;
    save(s);
    main.dataset.admission = a.admission_id;
    again.hidden = true;
    place.dataset.position = a.position || '';
    switch (a.state) {
      case 'queued':
        if (a.position) {
          say('queued', 'You are number ' + a.position + ' in line.', 'Estimated wait: ' + duration(a.estimated_wait_ms) + '.');
        } else if (a.estimated_wait_ms) {
          say('waiting', 'You are in the line. The sale opens in ' + duration(a.estimated_wait_ms) + '.',
            'At opening, the order of everyone already in line is drawn at random.');
        } else {
          say('queued', 'You are next: your turn is being prepared.');
        }
        later(pace(resp, a), next);
        return;
      case 'admitted':
        say('admitted', 'It is your turn. Taking you to the store…');
        if (a.return_to) {
          contLink.href = a.return_to;
          cont.hidden = false;
          window.location.assign(a.return_to);
        }
        return;
      case 'used':
        say('used', 'Your turn has been used: the store has your reservation.');
        return;
      case 'expired':
        say('expired', 'Your turn ended before you used it.');
        again.hidden = false;
        return;
      default:
        say(a.state, 'Your place is ' + a.state + '.');
    }
  }

  // refused handles an error answer in the edge's one shape.
  function refused(resp, err) {
    switch (err.code) {
      case 'NOT_FOUND': { // the region no longer knows the admission (a failover): enter again
        const s = saved();
        if (s && s.id) {
          delete s.id;
          save(s);
          enter();
          return;
        }
        break;
      }
      case 'OVERLOADED':
      case 'NOT_LEADER':
      case 'ABORTED':
      case 'UNKNOWN_OUTCOME':
      case 'INTERNAL':
        say('retrying', 'The waiting room is busy; trying again.');
        later(pace(resp, err), next);
        return;
      case 'PAUSED':
        say('paused', 'The sale is paused. You keep your place; this page checks again by itself.');
        later(pace(resp, err) + 4000, next);
        return;
      case 'SOLD_OUT':
        say('sold-out', 'Everything is taken for now. You keep your place in case items come back.');
        later(pace(resp, err) + 4000, next);
        return;
      case 'BOUND_ELSEWHERE':
        fail('You are already in this sale at region ' + err.region + ': go back to the store, which sends you there.');
        return;
    }
    fail(err.message || 'The waiting room refused: ' + err.code + '.');
  }

  // enter joins the line with the entry link the store gave (in the address, or kept).
  function enter() {
    const s = saved();
    if (!s || !s.user) {
      fail('This page needs the link your store gives you: go back to the store and open the waiting room from there.');
      return;
    }
    call('POST', '/admissions', { user: s.user, exp: s.exp, sig: s.sig });
  }

  // next polls the admission this tab has, or enters the line.
  function next() {
    const s = saved();
    if (s && s.id) {
      call('GET', '/admissions/' + encodeURIComponent(s.id));
    } else {
      enter();
    }
  }

  function start() {
    if (main.dataset.refused === 'true') return; // the server refused the link: its reason is shown
    const q = new URLSearchParams(window.location.search);
    if (q.has('user')) {
      const s = saved();
      const link = { user: q.get('user'), exp: q.get('exp'), sig: q.get('sig') };
      if (s && s.user === link.user && s.id) link.id = s.id; // a reload of the same link
      save(link);
      // The signed link leaves the address bar (and so the history): a reload finds the place
      // in sessionStorage.
      window.history.replaceState(null, '', window.location.pathname);
    }
    againButton.addEventListener('click', function () {
      const s = saved();
      if (s) {
        delete s.id;
        save(s);
      }
      say('joining', 'Joining the line…');
      enter();
    });
    next();
  }

  start();
})();
