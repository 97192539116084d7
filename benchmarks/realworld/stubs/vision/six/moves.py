import urllib
import urllib.request  # noqa: F401
