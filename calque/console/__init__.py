"""``calque console``: a live page of the fleet, served on 127.0.0.1 by the CLI's own process.

The process signs every API call with its starter's credentials (the CLI's client), as
``kubectl proxy`` does, and serves only what it renders from those answers plus the
package's own static files (htmx, a stylesheet): nothing is fetched from elsewhere at run
time. ``guard`` decides who may ask, ``snapshot`` reads the API, ``render`` and ``plots``
draw the page, ``server`` answers HTTP.
"""
