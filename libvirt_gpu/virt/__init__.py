"""The libvirt layer, in the manner of nova's: the connection (``host``),
a domain (``guest``), node-device XML (``nodedev``), the XML we build
(``config_xml``) and a domain's metadata (``metadata``)."""
