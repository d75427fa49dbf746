import { h } from '../dom.js';
import { pageHeading } from '../ui.js';

export function notFoundView(app) {
  app.setTitle('Not found');
  app.main.append(h('section', { class: 'card' },
    pageHeading('Nothing here'),
    h('p', {}, 'This page does not exist. ', h('a', { href: '/' }, 'Go home'), ' or ', h('a', { href: '/explore' }, 'explore Warble'), '.')));
}
